"""A job's final outcome and result: one item beside its status records.

On a channel that keeps results (`ChannelSpec.keep_results`, which needs track_status), the
consumer writes each job's final outcome once it reaches one (completed with the handler's
return value, dead-lettered for any reason, cancelled unrun), before it deletes the message:
a consumer that dies in between runs the job again, so no outcome is ever lost.
`Producer.result(job_id)` reads it, and whatever waits on the job (`messenger.jobs.workflows`:
held jobs, groups) registers on the same item (`add_waiter`), atomically with `finish`: of the
two writes, exactly one sees the other.

The item: table `status_table_name(ns)` (the status records' table), partition key
`message_id` = the job id, sort key `sk` = FINAL_SK ('~final', after every time-keyed record),
with `outcome` (an `Outcome` value), `channel`, `at`, the result as JSON text (`result`) or,
above INLINE_RESULT_BYTES, the pointer of its copy in the offload bucket (`result_s3`, under
RESULTS_PREFIX: the bucket's lifecycle rule expires it), `error_type`, `error`, `reason`,
`waiters` (a string set) and `expires_at` (the status records' expiry: the channel's
retention after the outcome). An item with `waiters` but no `outcome` is a job not final yet.

A return value that is not JSON-serializable does not fail the job: it completes, with no result
and the error 'result not JSON-serializable: <type>' (`FinalOutcome.completed`).
"""

from __future__ import annotations

import enum
import functools
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import DEFAULT_RETENTION_SECONDS, status_table_name
from messenger.errors import ChannelNotFound, JobFailed, RetryBudgetExhausted
from messenger.jobs.tables import ensure_table
from messenger.offload import RESULTS_PREFIX, OffloadPointer, PayloadStore
from messenger.settings import Settings

#: The sort key of a job's final-outcome item ('~' sorts after the records' '<time>#<event>').
FINAL_SK = "~final"
#: Encoded results (UTF-8 bytes of their JSON) up to this are kept in the item; larger ones go
#: to the offload bucket (a DynamoDB item holds at most 400 KB, its other attributes included).
INLINE_RESULT_BYTES = 350_000
#: BatchGetItem reads at most 100 keys per request.
DYNAMODB_MAX_BATCH_GET = 100
#: The error of a completed job whose return value JSON cannot encode (then its type's name).
NOT_SERIALIZABLE = "result not JSON-serializable"


class Outcome(str, enum.Enum):  # not StrEnum (3.11): EMR runs Python 3.9 too
    """How a job ended for good."""

    COMPLETED = "completed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    #: Deleted from its DLQ by an operator.
    DELETED = "deleted"
    #: Never finished within its channel's retention (a held job whose dependency never did).
    EXPIRED = "expired"

    def __str__(self) -> str:
        return str(self.value)


def encode_result(value: Any) -> str:
    """The JSON text of a result; TypeError or ValueError when JSON cannot encode it (NaN and
    infinities included: they are not JSON)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True)
class FinalOutcome:
    """A job's final outcome.

    job_id: the job (its message id). channel: the channel it ran on. outcome: how it ended.
    at: when (epoch seconds). result: a completed job's return value (JSON: dict, list, str,
    number, bool or None), resolved from S3 when it was offloaded. error_type / error: the
    handler's exception class and message when a handler failed ('' otherwise; a completed
    job's error says its return value was not serializable). reason: the dead-letter or cancel
    reason, as the status timeline shows it."""

    job_id: str
    channel: str
    outcome: Outcome
    at: float
    result: Any = None
    error_type: str = ""
    error: str = ""
    reason: str = ""

    @property
    def ok(self) -> bool:
        """The job completed."""
        return self.outcome is Outcome.COMPLETED

    def failure(self) -> JobFailed:
        """The `messenger.JobFailed` this outcome raises (`Producer.result`)."""
        return JobFailed(self.job_id, self.outcome.value, reason=self.reason,
                         error_type=self.error_type, error=self.error)

    @classmethod
    def completed(cls, job_id: str, channel: str, value: Any,
                  at: float | None = None) -> FinalOutcome:
        """A completed job's outcome with its handler's return value; a value JSON cannot
        encode is left out, and `error` says so (NOT_SERIALIZABLE: <type>)."""
        stamp = time.time() if at is None else at
        try:
            encode_result(value)
        except (TypeError, ValueError, RecursionError):
            return cls(job_id, channel, Outcome.COMPLETED, stamp,
                       error=f"{NOT_SERIALIZABLE}: {type(value).__name__}")
        return cls(job_id, channel, Outcome.COMPLETED, stamp, result=value)

    def as_dict(self) -> dict[str, Any]:
        """The outcome as JSON-ready fields (an answer of the HTTP API, a log line): job_id,
        channel, outcome, at, then `result` (completed) or the error fields that are set."""
        answer: dict[str, Any] = {"job_id": self.job_id, "channel": self.channel,
                                  "outcome": self.outcome.value, "at": self.at}
        if self.ok:
            answer["result"] = self.result
        for name in ("error_type", "error", "reason"):
            if getattr(self, name):
                answer[name] = getattr(self, name)
        return answer


class ResultStore:
    """Writes and reads jobs' final outcomes (see the module doc).

    clients, settings: as everywhere. offload: where results larger than INLINE_RESULT_BYTES go
    (default: the namespace's offload bucket, located at the first large result, as producers
    locate it). budget: seconds each call retries transient errors (default the settings'
    retry budget; a failure past it raises, and the caller decides: a consumer leaves the
    message in its queue and tries again later)."""

    def __init__(self, clients: ClientFactory, settings: Settings,
                 offload: PayloadStore | None = None, budget: float | None = None) -> None:
        self.clients = clients
        self.settings = settings
        self.table = status_table_name(settings.namespace)
        self.budget = settings.retry_budget_seconds if budget is None else budget
        self._offload = offload
        self._lock = threading.Lock()

    # -- table ------------------------------------------------------------------------------
    def ensure_table(self) -> None:
        """Create the status table (auto) or check it exists (verify): the outcomes' table."""
        ensure_table(self.clients, self.settings, self.table, "status", "message_id", "sk")

    @property
    def offload(self) -> PayloadStore:
        """The store of large results (the offload bucket; located at first use)."""
        with self._lock:
            if self._offload is None:
                from messenger.provision import Provisioner

                provisioner = Provisioner(self.clients, self.settings)
                self._offload = PayloadStore(self.clients.client("s3"),
                                             provisioner.ensure_bucket(), provisioner.key_arn())
            return self._offload

    def _call(self, what: str, call: Any) -> Any:
        try:
            return call_with_budget(call, self.budget, what, error=RetryBudgetExhausted)
        except ClientError as error:
            if error_code(error) == "ResourceNotFoundException":
                raise ChannelNotFound(
                    f"status table {self.table!r} does not exist: no channel in namespace "
                    f"{self.settings.namespace or '(none)'!r} keeps results") from None
            raise

    @staticmethod
    def _key(job_id: str) -> dict[str, Any]:
        return {"message_id": {"S": job_id}, "sk": {"S": FINAL_SK}}

    # -- writing ----------------------------------------------------------------------------
    def finish(self, outcome: FinalOutcome, retention_seconds: int = DEFAULT_RETENTION_SECONDS
               ) -> frozenset[str]:
        """Record the job's final outcome (one UpdateItem; a large result is put in S3 first),
        overwriting an earlier one (a dead-lettered job requeued that completes later), under
        the expiry `retention_seconds` after `outcome.at`. Returns the ids of what waits on
        the job (`add_waiter`). Idempotent: a retry after a lost answer writes the same."""
        names = {"#outcome": "outcome", "#channel": "channel", "#at": "at",
                 "#expires": "expires_at", "#result": "result", "#pointer": "result_s3",
                 "#type": "error_type", "#error": "error", "#reason": "reason"}
        values: dict[str, Any] = {
            ":outcome": {"S": outcome.outcome.value}, ":channel": {"S": outcome.channel},
            ":at": {"N": repr(float(outcome.at))},
            ":expires": {"N": str(int(outcome.at + retention_seconds))},
        }
        sets = ["#outcome = :outcome", "#channel = :channel", "#at = :at",
                "#expires = :expires"]
        removes = []
        kept: dict[str, str | None] = {"#result": None, "#pointer": None}
        if outcome.ok and not outcome.error:
            text = encode_result(outcome.result)
            data = text.encode("utf-8")
            if len(data) > INLINE_RESULT_BYTES:
                store = self.offload
                pointer = call_with_budget(lambda: store.put(data, prefix=RESULTS_PREFIX),
                                           self.budget, "offloading a result to S3")
                kept["#pointer"] = pointer.encode()
            else:
                kept["#result"] = text
        for name, value in (*kept.items(), ("#type", outcome.error_type),
                            ("#error", outcome.error), ("#reason", outcome.reason)):
            if value:
                sets.append(f"{name} = :{names[name]}")
                values[f":{names[name]}"] = {"S": value}
            else:
                removes.append(name)
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes)
                                                 if removes else "")
        dynamodb = self.clients.client("dynamodb")
        answer = self._call(f"recording the outcome of job {outcome.job_id}", functools.partial(
            dynamodb.update_item, TableName=self.table, Key=self._key(outcome.job_id),
            UpdateExpression=expression, ExpressionAttributeNames=names,
            # the item before: its waiters are the item's (finish leaves them), without the
            # result just written coming back (up to INLINE_RESULT_BYTES)
            ExpressionAttributeValues=values, ReturnValues="ALL_OLD"))
        return frozenset(answer.get("Attributes", {}).get("waiters", {}).get("SS", []))

    def add_waiter(self, job_id: str, waiter: str,
                   retention_seconds: int = DEFAULT_RETENTION_SECONDS) -> FinalOutcome | None:
        """Register `waiter` (one UpdateItem: ADD to `waiters`; an item not there yet expires
        `retention_seconds` from now, an existing one keeps its expiry). Returns the job's
        final outcome when it has one already (then nothing will call the waiter: act on it
        now), else None (`finish` will return `waiter`). Idempotent."""
        dynamodb = self.clients.client("dynamodb")
        answer = self._call(f"waiting on job {job_id}", functools.partial(
            dynamodb.update_item, TableName=self.table, Key=self._key(job_id),
            UpdateExpression="ADD waiters :waiter SET #expires = if_not_exists(#expires, :e)",
            ExpressionAttributeNames={"#expires": "expires_at"},
            ExpressionAttributeValues={":waiter": {"SS": [waiter]},
                                       ":e": {"N": str(int(time.time() + retention_seconds))}},
            ReturnValues="ALL_NEW"))
        return self._outcome_of(answer.get("Attributes", {}))

    def remove_waiter(self, job_id: str, waiter: str) -> None:
        """Unregister `waiter` (nothing happens when it was not registered)."""
        dynamodb = self.clients.client("dynamodb")
        try:
            self._call(f"no longer waiting on job {job_id}", functools.partial(
                dynamodb.update_item, TableName=self.table, Key=self._key(job_id),
                UpdateExpression="DELETE waiters :waiter",
                ConditionExpression="attribute_exists(message_id)",
                ExpressionAttributeValues={":waiter": {"SS": [waiter]}}))
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise

    # -- reading ----------------------------------------------------------------------------
    def get(self, job_id: str) -> FinalOutcome | None:
        """The job's final outcome (a consistent read), None while it has none."""
        dynamodb = self.clients.client("dynamodb")
        answer = self._call(f"reading the outcome of job {job_id}", functools.partial(
            dynamodb.get_item, TableName=self.table, Key=self._key(job_id),
            ConsistentRead=True))
        return self._outcome_of(answer.get("Item", {}))

    def waiters(self, job_id: str) -> frozenset[str]:
        """The ids of what waits on the job (`add_waiter`), whether it is final or not (one
        consistent GetItem of the `waiters` attribute only)."""
        dynamodb = self.clients.client("dynamodb")
        answer = self._call(f"reading what waits on job {job_id}", functools.partial(
            dynamodb.get_item, TableName=self.table, Key=self._key(job_id),
            ProjectionExpression="waiters", ConsistentRead=True))
        return frozenset(answer.get("Item", {}).get("waiters", {}).get("SS", []))

    def get_many(self, job_ids: Iterable[str]) -> dict[str, FinalOutcome]:
        """The final outcomes of the jobs that have one, by job id (BatchGetItem, 100 keys a
        request, consistent reads; keys DynamoDB leaves unprocessed are asked again)."""
        dynamodb = self.clients.client("dynamodb")
        wanted = list(dict.fromkeys(job_ids))
        found: dict[str, FinalOutcome] = {}
        for start in range(0, len(wanted), DYNAMODB_MAX_BATCH_GET):
            keys = [self._key(job_id) for job_id in wanted[start:start + DYNAMODB_MAX_BATCH_GET]]
            for attempt in range(10):
                request = {self.table: {"Keys": keys, "ConsistentRead": True}}
                answer = self._call("reading job outcomes", functools.partial(
                    dynamodb.batch_get_item, RequestItems=request))
                for item in answer.get("Responses", {}).get(self.table, []):
                    outcome = self._outcome_of(item)
                    if outcome is not None:
                        found[outcome.job_id] = outcome
                keys = answer.get("UnprocessedKeys", {}).get(self.table, {}).get("Keys", [])
                if not keys:
                    break
                time.sleep(min(1.0, 0.05 * 2**attempt))
            if keys:
                raise RetryBudgetExhausted(
                    f"reading job outcomes: DynamoDB left {len(keys)} key(s) unprocessed")
        return found

    def _outcome_of(self, item: dict[str, Any]) -> FinalOutcome | None:
        """The outcome an item stores (None: none, or only waiters); an offloaded result is
        read from S3 (PayloadMissing when its object expired)."""
        if "outcome" not in item:
            return None

        def text(name: str) -> str:
            return str(item.get(name, {}).get("S", ""))

        result: Any = None
        if "result" in item:
            result = json.loads(text("result"))
        elif "result_s3" in item:
            pointer = _pointer(text("result_s3"))
            store = self._offload or PayloadStore(self.clients.client("s3"), pointer.bucket)
            result = json.loads(call_with_budget(lambda: store.get(pointer), self.budget,
                                                 "reading a result from S3"))
        return FinalOutcome(
            job_id=text("message_id"), channel=text("channel"), outcome=Outcome(text("outcome")),
            at=float(item.get("at", {}).get("N", "0")), result=result,
            error_type=text("error_type"), error=text("error"), reason=text("reason"))


def _pointer(encoded: str) -> OffloadPointer:
    """An `OffloadPointer` back from its `encode()`d form."""
    _, target = json.loads(encoded)
    return OffloadPointer(bucket=str(target["s3BucketName"]), key=str(target["s3Key"]))


def is_final_item(item: dict[str, Any]) -> bool:
    """A status-table item that is a job's final-outcome item (FINAL_SK), not a record: the
    timeline readers skip it."""
    return item.get("sk", {}).get("S") == FINAL_SK


__all__ = ["DYNAMODB_MAX_BATCH_GET", "FINAL_SK", "INLINE_RESULT_BYTES", "NOT_SERIALIZABLE",
           "FinalOutcome", "Outcome", "ResultStore", "encode_result", "is_final_item"]
