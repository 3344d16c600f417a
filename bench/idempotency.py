"""Idempotent handlers' cost: DynamoDB requests per message, counted with botocore's
'before-send' event through `IdempotencyGuard.run` (what `idempotent = True` adds to each
handler call), for a first run, a duplicate, and a handler that raises. SQS requests are those of
a plain consumer (a duplicate is deleted like a completed message). Runs against a child-process
moto server (or AWS_ENDPOINT_URL if set). Prints JSON. Target: <= 2 requests for a first run.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.consume.idempotency import AlreadyDone, IdempotencyGuard  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

MESSAGES = int(os.environ.get("BENCH_MESSAGES", "200"))


def per_message(guard: IdempotencyGuard, clients: ClientFactory, ids: list[str],
                handler, expected: type[BaseException] | None) -> dict[str, float]:
    counter = RequestCounter().attach(clients)
    for message_id in ids:
        try:
            guard.run(handler, SimpleNamespace(message_id=message_id))
        except BaseException as error:  # noqa: B036 - what the guard raises is the point
            if expected is None or not isinstance(error, expected):
                raise
    counter.detach(clients)
    return {operation: count / len(ids) for operation, count in sorted(counter.counts.items())}


def failing(_: object) -> None:
    raise RuntimeError("handler failed")


def main() -> None:
    with endpoint_from_env():
        settings = Settings.from_env(namespace=f"bench{uuid.uuid4().hex[:6]}")
        clients = ClientFactory(settings.region)
        guard = IdempotencyGuard(clients, settings, "bench_idempotency", processing_timeout=60)
        guard.ensure()
        ids = [uuid.uuid4().hex for _ in range(MESSAGES)]
        first = per_message(guard, clients, ids, lambda _: None, None)
        duplicate = per_message(guard, clients, ids, lambda _: None, AlreadyDone)
        raised = per_message(guard, clients, [uuid.uuid4().hex for _ in range(MESSAGES)],
                             failing, RuntimeError)
    print(json.dumps({
        "bench": "idempotency", "messages": MESSAGES,
        "requests_per_message": {"first_run": first, "duplicate": duplicate,
                                 "handler_raised": raised},
        "first_run_total": sum(first.values()), "target_first_run_total": 2,
        "ok": sum(first.values()) <= 2,
    }, indent=2))


if __name__ == "__main__":
    main()
