"""Retried firings are one job: the first copy of a scheduled job a consumer receives claims it.

EventBridge Scheduler delivers at least once: a firing may be sent twice, each copy with the job
id fixed at scheduling time (a one-time job's message id, a recurring one's
'<name>@<scheduled time>'). An ordered channel's copies share their deduplication id, but SQS
drops a repeat only within 5 minutes, and Scheduler retries for up to 24 hours. So a consumer
that receives a message marked as fired by the scheduler (`SCHEDULED_HEADER` in its meta
headers) claims the job once, before it runs the handler: one conditional PutItem in the dedup
table (`<namespace->messenger-dedup`), key 'fired@<consumer channel>#<job id>', holding the SQS
MessageId of the copy that claimed it. Only marked messages pay this write.

- The id is free, the claim is past its window, or it is this copy's own (a redelivery of the
  same SQS message: a retry after a failure, a lease that ran out): the copy runs.
- The claim is another copy's: a retried firing; the consumer deletes this copy unrun.
- The write fails past the retry budget: the copy is neither run nor dropped; it is retried.
- A claimed copy that is dead-lettered gives its claim back (`release`): an operator's requeue
  of the job (a new SQS message) is a new run, not a repeat.

A claim lasts `CLAIM_SECONDS`: a second copy is sent within Scheduler's 24 hours of retries
after the first and lives at most a queue's 14-day retention, so no copy outlives the claim.
Items: `dedup_key`, `sqs_message_id`, `job_id`, `channel`, `claimed_at`, `expires_at` (TTL).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import FIRED_CLAIM_PREFIX, SQS_MAX_RETENTION_SECONDS
from messenger.jobs.dedup import DedupTable
from messenger.jobs.schedules import MAX_EVENT_AGE_SECONDS, SCHEDULED_HEADER
from messenger.jobs.tables import EXPIRES_AT
from messenger.message import MESSAGE_ID_ATTRIBUTE
from messenger.settings import Settings
from messenger.tracing import received_headers

logger = logging.getLogger("messenger.fired")

#: Seconds a claim holds: a queue's longest retention after Scheduler's longest retrying.
CLAIM_SECONDS = SQS_MAX_RETENTION_SECONDS + MAX_EVENT_AGE_SECONDS
#: Key prefix of the claims in the dedup table (the producers' claims are '<channel>#<id>').
KEY_PREFIX = FIRED_CLAIM_PREFIX

_CLAIM_CONDITION = ("attribute_not_exists(dedup_key) OR expires_at <= :now OR "
                    "sqs_message_id = :mine")


@dataclass(frozen=True)
class FiredElsewhere:
    """The claim of another copy of the job: its SQS MessageId and when it claimed (epoch s)."""

    job_id: str
    sqs_message_id: str
    claimed_at: float


def claim_key(channel: str, job_id: str) -> str:
    return f"{KEY_PREFIX}{channel}#{job_id}"


def fired_job_id(raw: Mapping[str, Any]) -> str | None:
    """The job id of a received SQS message the scheduler fired (marked with SCHEDULED_HEADER),
    else None."""
    if SCHEDULED_HEADER not in received_headers(raw):
        return None
    value = raw.get("MessageAttributes", {}).get(MESSAGE_ID_ATTRIBUTE, {}).get("StringValue")
    return str(value) if value else None


class FiringClaims:
    """Claims of scheduled jobs by the copies a consumer of `channel` receives (see the module
    doc); safe to share between threads. The table is checked (verify) or created (auto) at the
    first claim."""

    def __init__(self, clients: ClientFactory, settings: Settings, channel: str) -> None:
        self.clients = clients
        self.settings = settings
        self.channel = channel
        self._table = DedupTable(clients, settings)
        self.table = self._table.name

    def claim(self, job_id: str, sqs_message_id: str) -> FiredElsewhere | None:
        """Claim `job_id` on the consumer's channel for this copy (`sqs_message_id`): None
        when this copy may run it, the other copy's claim when it is a repeat. Raises what the
        table raises past the retry budget (the copy is then retried, never run unclaimed)."""
        self._table.ensure()
        now = time.time()
        channel = self.channel
        request = {
            "TableName": self.table,
            "Item": {
                "dedup_key": {"S": claim_key(channel, job_id)},
                "sqs_message_id": {"S": sqs_message_id}, "job_id": {"S": job_id},
                "channel": {"S": channel}, "claimed_at": {"N": repr(now)},
                EXPIRES_AT: {"N": str(int(now) + CLAIM_SECONDS)},
            },
            "ConditionExpression": _CLAIM_CONDITION,
            "ExpressionAttributeValues": {":now": {"N": repr(now)},
                                          ":mine": {"S": sqs_message_id}},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        dynamodb = self.clients.client("dynamodb")
        try:
            call_with_budget(functools.partial(dynamodb.put_item, **request),
                             self.settings.retry_budget_seconds,
                             f"claiming scheduled job {job_id!r}")
            return None
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            old = error.response.get("Item", {})
        return FiredElsewhere(job_id, old.get("sqs_message_id", {}).get("S", ""),
                              float(old.get("claimed_at", {}).get("N", 0)))

    def release(self, job_id: str, sqs_message_id: str) -> None:
        """Give this copy's claim back (it was dead-lettered): only its own. A failure is logged:
        the claim then holds until it expires."""
        try:
            self.clients.client("dynamodb").delete_item(
                TableName=self.table,
                Key={"dedup_key": {"S": claim_key(self.channel, job_id)}},
                ConditionExpression="sqs_message_id = :mine",
                ExpressionAttributeValues={":mine": {"S": sqs_message_id}})
        except (ClientError, BotoCoreError) as error:
            if error_code(error) == "ConditionalCheckFailedException":
                return  # not ours (or gone)
            logger.warning("releasing the claim of scheduled job %s on %s failed (a requeue of "
                           "it within %d days is taken for a repeat): %s", job_id, self.channel,
                           CLAIM_SECONDS // 86_400, error)
