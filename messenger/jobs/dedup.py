"""Dedup on enqueue: a second push of the same message id within a window is not sent.

A producer with `dedup=True` claims '<channel>#<message id>' in a DynamoDB table with one
conditional PutItem before it sends (the one extra request per message): the write succeeds only
when no unexpired claim exists, so of two producers racing on one id exactly one sends. A claim
expires `window_seconds` after it was made (DynamoDB TTL removes it later; the condition compares
`expires_at` itself, since TTL deletes lazily). A send that fails releases its claim (a retry is
not a duplicate); a producer killed between claim and send leaves the id claimed for the window:
a retry within it is reported as a duplicate of a message that was never sent, so keep the
window short (default 5 minutes) when producers may die mid-push.

Table `<namespace->messenger-dedup`: partition key `dedup_key`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import SQS_MAX_RETENTION_SECONDS, dedup_table_name
from messenger.errors import InvalidSettings
from messenger.jobs.tables import EXPIRES_AT, ensure_table
from messenger.settings import Settings

logger = logging.getLogger("messenger.dedup")

DEFAULT_WINDOW_SECONDS = 300
MIN_WINDOW_SECONDS = 1
#: SQS's own deduplication interval on FIFO queues and topics (not configurable).
SQS_DEDUP_INTERVAL_SECONDS = 300
#: Deduplication ids an ordered producer remembers (the newest) to report SQS's own drops.
MAX_REMEMBERED_IDS = 100_000


def check_window(window_seconds: Any, owner: str = "dedup_window") -> int:
    """The window in whole seconds (1 to SQS's 14-day maximum retention); InvalidSettings else."""
    if isinstance(window_seconds, bool) or not isinstance(window_seconds, int) or \
            not MIN_WINDOW_SECONDS <= window_seconds <= SQS_MAX_RETENTION_SECONDS:
        raise InvalidSettings(
            f"{owner} must be a whole number of seconds from {MIN_WINDOW_SECONDS} to "
            f"{SQS_MAX_RETENTION_SECONDS} (the longest retention), got {window_seconds!r}"
        )
    return window_seconds


@dataclass(frozen=True)
class Claim:
    """A claim made by this producer: released again if its send fails."""

    key: str
    token: str


@dataclass(frozen=True)
class Duplicate:
    """The claim that made a push a duplicate: when it was made (epoch seconds, 0 if unknown)."""

    key: str
    claimed_at: float


class DedupStore:
    """Claims message ids in the dedup table (see the module doc); safe to share between
    threads."""

    def __init__(self, clients: ClientFactory, settings: Settings) -> None:
        self.clients = clients
        self.settings = settings
        self.table = dedup_table_name(settings.namespace)
        self._ready = False
        self._lock = threading.Lock()

    def _ensure(self) -> None:
        with self._lock:
            if not self._ready:
                call_with_budget(
                    lambda: ensure_table(self.clients, self.settings, self.table, "dedup",
                                         "dedup_key"),
                    self.settings.retry_budget_seconds, f"checking table {self.table!r}")
                self._ready = True

    def claim(self, channel: str, message_id: str, window_seconds: int) -> Claim | Duplicate:
        """Claim the id for `window_seconds`: a Claim, or the Duplicate that holds it."""
        self._ensure()
        key = f"{channel}#{message_id}"
        now = time.time()
        token = uuid.uuid4().hex
        item = {
            "dedup_key": {"S": key}, "message_id": {"S": message_id}, "channel": {"S": channel},
            "claimed_at": {"N": repr(now)}, "token": {"S": token},
            EXPIRES_AT: {"N": str(int(now) + window_seconds)},
        }
        dynamodb = self.clients.client("dynamodb")
        try:
            call_with_budget(lambda: dynamodb.put_item(
                TableName=self.table, Item=item,
                ConditionExpression="attribute_not_exists(dedup_key) OR expires_at <= :now",
                ExpressionAttributeValues={":now": {"N": str(int(now))}},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            ), self.settings.retry_budget_seconds, f"claiming message id {message_id!r}")
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            old = error.response.get("Item", {})
            return Duplicate(key, float(old.get("claimed_at", {}).get("N", 0)))
        return Claim(key, token)

    def release(self, claim: Claim) -> None:
        """Give a claim back (its send failed); only ours, never a newer producer's."""
        try:
            self.clients.client("dynamodb").delete_item(
                TableName=self.table, Key={"dedup_key": {"S": claim.key}},
                ConditionExpression="#t = :t", ExpressionAttributeNames={"#t": "token"},
                ExpressionAttributeValues={":t": {"S": claim.token}})
        except (ClientError, BotoCoreError) as error:
            logger.warning("dedup: releasing claim %s failed (it expires with its window): %s",
                           claim.key, error)


class RecentIds:
    """The deduplication ids an ordered producer sent in SQS's 5-minute interval: a repeat is
    dropped by SQS, so the producer reports it as a duplicate instead of as published."""

    def __init__(self, interval: float = SQS_DEDUP_INTERVAL_SECONDS,
                 capacity: int = MAX_REMEMBERED_IDS) -> None:
        self.interval = interval
        self.capacity = capacity
        self._sent: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, dedup_id: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        with self._lock:
            sent = self._sent.get(dedup_id)
            return sent is not None and now - sent < self.interval

    def add(self, dedup_ids: list[str], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            for dedup_id in dedup_ids:
                sent = self._sent.get(dedup_id)
                if sent is not None and now - sent < self.interval:
                    continue  # SQS's interval runs from the first send
                self._sent.pop(dedup_id, None)
                self._sent[dedup_id] = now  # the newest last: expiry pops from the front
            while self._sent and (len(self._sent) > self.capacity or
                                  now - next(iter(self._sent.values())) >= self.interval):
                self._sent.popitem(last=False)
