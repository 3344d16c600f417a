"""One job id, one run: the first copy of a job that carries an id claims it at its consumer.

A job carries an id when its id was fixed before it was sent, so that every copy SQS may hold
has it: a job the scheduler fired (`SCHEDULED_HEADER` in its meta headers: a one-time job's
message id, a recurring one's '<name>@<scheduled time>'), and a push with dedup on (a dedup
producer's `message_id`, an HTTP Idempotency-Key's job id: `JOB_WINDOW_HEADER`, the producer's
dedup window in seconds). Two copies of such a job come from EventBridge Scheduler's at least
once delivery (a retried firing) and from a send SQS applied but answered with an error, which
botocore's retry then sends again (two SQS messages, one job id). So a consumer that receives a
marked message claims the job once, before it runs the handler: one conditional PutItem in the
dedup table (`<namespace->messenger-dedup`), key 'fired@<consumer channel>#<job id>', holding
the SQS MessageId of the copy that claimed it. Plain jobs (no mark) pay nothing.

- The id is free, the claim is past its window, or it is this copy's own (a redelivery of the
  same SQS message: a retry after a failure, a lease that ran out): the copy runs.
- The claim is another copy's: a repeat; the consumer deletes this copy unrun (DUPLICATE).
- The claim is a cancel's (`cancel`, written by `messenger schedules cancel` before it deletes
  the schedule): the job was cancelled; the consumer deletes this copy unrun (CANCELLED).
- The write fails past the retry budget: the copy is neither run nor dropped; it is retried.
- A claimed copy that is dead-lettered gives its claim back (`release`, only its own): an
  operator's requeue of the job (a new SQS message) is a new run, not a repeat.

A claim lasts its window: a fired job's `CLAIM_SECONDS` (a second copy is sent within
Scheduler's 24 hours of retries after the first and lives at most a queue's 14-day retention,
so no copy outlives the claim), a dedup push's its producer's dedup window (the promise: at
most one run per job id within that window). A cancel's mark lasts `CLAIM_SECONDS` past the
job's due time. Items: `dedup_key`, `sqs_message_id` (a run's claim) or `cancelled_by` and
`cancelled_at` (a cancel's), `job_id`, `channel`, `claimed_at`, `expires_at` (TTL).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import FIRED_CLAIM_PREFIX, SQS_MAX_RETENTION_SECONDS
from messenger.errors import MessengerError
from messenger.jobs.dedup import DedupTable
from messenger.jobs.schedules import MAX_EVENT_AGE_SECONDS, SCHEDULED_HEADER
from messenger.jobs.tables import EXPIRES_AT, put_unless_held
from messenger.message import MESSAGE_ID_ATTRIBUTE
from messenger.settings import Settings
from messenger.tracing import received_headers

logger = logging.getLogger("messenger.fired")

#: Seconds a fired job's claim holds: a queue's longest retention after Scheduler's longest
#: retrying.
CLAIM_SECONDS = SQS_MAX_RETENTION_SECONDS + MAX_EVENT_AGE_SECONDS
#: Key prefix of the claims in the dedup table (the producers' claims are '<channel>#<id>').
KEY_PREFIX = FIRED_CLAIM_PREFIX
#: Meta header of a job pushed with dedup on: its producer's dedup window in seconds. Its
#: consumer claims the job id for that long (`JobClaims.claim`).
JOB_WINDOW_HEADER = "messenger-job-window"
#: DynamoDB's TransactWriteItems limit: the most consumer channels one cancel marks.
MAX_CANCEL_CHANNELS = 100

_CLAIM_CONDITION = ("attribute_not_exists(dedup_key) OR expires_at <= :now OR "
                    "sqs_message_id = :mine")
# A cancel marks a free id, one past its window, or one it marked already (cancelled twice).
_CANCEL_CONDITION = ("attribute_not_exists(dedup_key) OR expires_at <= :now OR "
                     "attribute_exists(cancelled_at)")


@dataclass(frozen=True)
class FiredElsewhere:
    """The claim of another copy of the job: its SQS MessageId and when it claimed (epoch s)."""

    job_id: str
    sqs_message_id: str
    claimed_at: float


@dataclass(frozen=True)
class Cancelled:
    """The job was cancelled before any copy claimed it: by whom and when (epoch s)."""

    job_id: str
    by: str
    at: float


@dataclass(frozen=True)
class JobMark:
    """What a received message says of its job id: the id, the claim's window in seconds, and
    whether the scheduler fired it."""

    job_id: str
    window: int
    fired: bool


def claim_key(channel: str, job_id: str) -> str:
    return f"{KEY_PREFIX}{channel}#{job_id}"


def job_mark(headers: Mapping[str, str], job_id: str | None) -> JobMark | None:
    """The job mark of a message with these meta headers and id (None: a plain job: no
    claim). A fired job's window is CLAIM_SECONDS; a dedup push's its header's (whole seconds,
    1 to a queue's longest retention: anything else is no mark)."""
    if not job_id:
        return None
    if SCHEDULED_HEADER in headers:
        return JobMark(job_id, CLAIM_SECONDS, True)
    window = headers.get(JOB_WINDOW_HEADER)
    if window is None or not window.isdigit() or \
            not 1 <= int(window) <= SQS_MAX_RETENTION_SECONDS:
        return None
    return JobMark(job_id, int(window), False)


def received_job_mark(raw: Mapping[str, Any]) -> JobMark | None:
    """The job mark of a received SQS message (see `job_mark`)."""
    value = raw.get("MessageAttributes", {}).get(MESSAGE_ID_ATTRIBUTE, {}).get("StringValue")
    return job_mark(received_headers(raw), str(value) if value else None)


def fired_job_id(raw: Mapping[str, Any]) -> str | None:
    """The job id of a received SQS message the scheduler fired (marked with SCHEDULED_HEADER),
    else None."""
    mark = received_job_mark(raw)
    return mark.job_id if mark is not None and mark.fired else None


class JobClaims:
    """Claims of jobs that carry an id by the copies a consumer of `channel` receives (see the
    module doc); safe to share between threads. The table is checked (verify) or created (auto)
    at the first claim."""

    def __init__(self, clients: ClientFactory, settings: Settings, channel: str) -> None:
        self.clients = clients
        self.settings = settings
        self.channel = channel
        self._table = DedupTable(clients, settings)
        self.table = self._table.name

    def claim(self, job_id: str, sqs_message_id: str, window: int = CLAIM_SECONDS
              ) -> FiredElsewhere | Cancelled | None:
        """Claim `job_id` on the consumer's channel for this copy (`sqs_message_id`) for
        `window` seconds: None when this copy may run it, the other copy's claim when it is a
        repeat, the cancel when it was cancelled. Raises what the table raises past the retry
        budget (the copy is then retried, never run unclaimed)."""
        self._table.ensure()
        now = time.time()
        channel = self.channel
        request = {
            "TableName": self.table,
            "Item": {
                "dedup_key": {"S": claim_key(channel, job_id)},
                "sqs_message_id": {"S": sqs_message_id}, "job_id": {"S": job_id},
                "channel": {"S": channel}, "claimed_at": {"N": repr(now)},
                EXPIRES_AT: {"N": str(int(now) + window)},
            },
            "ConditionExpression": _CLAIM_CONDITION,
            "ExpressionAttributeValues": {":now": {"N": repr(now)},
                                          ":mine": {"S": sqs_message_id}},
        }
        old = put_unless_held(self.clients.client("dynamodb"), request,
                              self.settings.retry_budget_seconds, f"claiming job {job_id!r}")
        return None if old is None else _holder(job_id, old)

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
            logger.warning("releasing the claim of job %s on %s failed (a requeue of it within "
                           "its window is taken for a repeat): %s", job_id, self.channel, error)


def release_dead_copies(clients: ClientFactory, settings: Settings, channel: str,
                        messages: Sequence[Mapping[str, Any]]) -> int:
    """Before a requeue sends received DLQ messages back: each that carries a job id gives back
    the claim its copy holds on `channel` (the channel whose DLQ they are in), so the requeue
    runs. A copy SQS's redrive moved to the DLQ keeps its SQS MessageId and its claim (its
    consumer stopped during the last attempt, and never gave it back; a copy the consumer
    dead-lettered itself gave it back already). Only that copy's claim: another copy's stays.
    One conditional DeleteItem per message with a job id; returns how many were asked."""
    claims = JobClaims(clients, settings, channel)
    asked = 0
    for raw in messages:
        mark = received_job_mark(raw)
        if mark is not None:
            claims.release(mark.job_id, str(raw["MessageId"]))
            asked += 1
    return asked


#: The consumers' claims were of fired jobs only before; the name stays for their callers.
FiringClaims = JobClaims


def _holder(job_id: str, old: Mapping[str, Any]) -> FiredElsewhere | Cancelled:
    """What the item that failed a claim's condition says: a cancel, or another copy's claim."""
    if "cancelled_at" in old:
        return Cancelled(job_id, old.get("cancelled_by", {}).get("S", ""),
                         float(old["cancelled_at"].get("N", 0)))
    return FiredElsewhere(job_id, old.get("sqs_message_id", {}).get("S", ""),
                          float(old.get("claimed_at", {}).get("N", 0)))


def cancel(clients: ClientFactory, settings: Settings, job_id: str, channels: Sequence[str],
           by: str, until: float) -> tuple[str, FiredElsewhere] | None:
    """Mark `job_id` cancelled on each consumer channel that may receive it (its claim taken by
    the cancel, held until `until` epoch seconds), before its schedule is deleted: a firing
    that races the delete then finds the mark and is deleted unrun. None when every channel is
    marked (the job will not run, on any of them), else (channel, claim) of a copy that fired
    first on one of them (then none is marked: the job runs). One conditional
    PutItem for one channel, one TransactWriteItems (all or none) for several."""
    if not channels:
        return None
    if len(channels) > MAX_CANCEL_CHANNELS:
        raise MessengerError(f"scheduled job {job_id!r} goes to {len(channels)} consumer "
                             f"channels; a cancel marks at most {MAX_CANCEL_CHANNELS}")
    table = DedupTable(clients, settings)
    table.ensure()
    now = time.time()
    dynamodb = clients.client("dynamodb")

    def put(channel: str) -> dict[str, Any]:
        return {
            "TableName": table.name,
            "Item": {"dedup_key": {"S": claim_key(channel, job_id)}, "job_id": {"S": job_id},
                     "channel": {"S": channel}, "claimed_at": {"N": repr(now)},
                     "cancelled_at": {"N": repr(now)}, "cancelled_by": {"S": by},
                     EXPIRES_AT: {"N": str(int(max(now, until)) + CLAIM_SECONDS)}},
            "ConditionExpression": _CANCEL_CONDITION,
            "ExpressionAttributeValues": {":now": {"N": repr(now)}},
        }

    budget = settings.retry_budget_seconds
    if len(channels) == 1:
        old = put_unless_held(dynamodb, put(channels[0]), budget, f"cancelling job {job_id!r}")
        return None if old is None else (channels[0], _claimer(job_id, old))
    try:
        call_with_budget(functools.partial(
            dynamodb.transact_write_items,
            TransactItems=[{"Put": {**put(channel),
                                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}}
                           for channel in channels]),
            budget, f"cancelling job {job_id!r}")
        return None
    except ClientError as error:
        if error_code(error) != "TransactionCanceledException":
            raise
        reasons = error.response.get("CancellationReasons", [])
    for channel, reason in zip(channels, reasons):
        if reason.get("Code") == "ConditionalCheckFailed":
            item = reason.get("Item") or dynamodb.get_item(
                TableName=table.name, Key={"dedup_key": {"S": claim_key(channel, job_id)}},
                ConsistentRead=True).get("Item", {})
            return channel, _claimer(job_id, item)
    raise MessengerError(f"cancelling job {job_id!r}: DynamoDB refused the marks "
                         f"({[r.get('Code') for r in reasons]}); not cancelled, try again")


def claim_of(clients: ClientFactory, settings: Settings, channel: str, job_id: str
             ) -> FiredElsewhere | Cancelled | None:
    """The live claim of `job_id` on a consumer channel (one consistent GetItem): a copy's, a
    cancel's, or None (unclaimed, past its window, or no dedup table)."""
    try:
        item = clients.client("dynamodb").get_item(
            TableName=DedupTable(clients, settings).name,
            Key={"dedup_key": {"S": claim_key(channel, job_id)}},
            ConsistentRead=True).get("Item")
    except ClientError as error:
        if error_code(error) != "ResourceNotFoundException":
            raise
        return None  # no table: nothing was ever claimed
    if not item or float(item.get(EXPIRES_AT, {}).get("N", 0)) <= time.time():
        return None
    return _holder(job_id, item)


def _claimer(job_id: str, item: Mapping[str, Any]) -> FiredElsewhere:
    holder = _holder(job_id, item)
    if isinstance(holder, Cancelled):  # cannot be: a cancel's mark passes the condition
        return FiredElsewhere(job_id, "", holder.at)
    return holder
