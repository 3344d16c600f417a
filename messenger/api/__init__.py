"""The HTTP job API: any service enqueues a job on a channel with one authenticated POST.

- `messenger.api.app`: `JobApi`, Powertools' REST resolver over the channels' producers (what the
  Lambda `lambdas/http_enqueue` runs).
- `messenger.api.requests`: the request models and their limits.
- `messenger.api.channels`: the channels an API serves (`MESSENGER_API_CHANNELS`).
- `messenger.api.deadline`: one deadline per request, shared by its AWS calls.
- `messenger.api.local`: the same API on loopback, real HTTP requests turned into API Gateway
  proxy events (`messenger api`).

Needs the `api` extra (Powertools and pydantic); deployed by `stacks.http_enqueue.HttpEnqueue`.
Guide: docs/http-enqueue.md.
"""
