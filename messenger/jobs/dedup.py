"""Dedup on enqueue: a second push of the same message id within a window is not sent, and no
push is ever reported as a duplicate of a message that was not sent.

A producer with `dedup=True` claims '<channel>#<message id>' in a DynamoDB table before it sends,
with one conditional PutItem that carries a token of its own, and marks the claim SENT after the
send (the second write: one PutItem for `push`, BatchWriteItem of up to 25 for `push_many`).
The claim succeeds when the id is free, when the claim there is its own token's (the answer to an
earlier attempt of the same claim was lost: a timeout or a 5xx after DynamoDB stored it), when a
claim never marked SENT is past its lease (its producer died, or its send and its release
both failed), or when the window is over. Otherwise the item says what happened:

- SENT (or an item of the older schema, without a state): a duplicate, not sent;
- CLAIMED by another token within its lease: in progress elsewhere (`Held`); the push waits
  within its retry budget for it to be SENT (a duplicate) or taken over, else it fails
  (PublishFailed, or a `ClaimHeld` failure in push_many): it was not sent, retry later.

A send that fails gives its claim back (DeleteItem, only its own token), so a retry goes at
once; if that fails too, the store remembers the token and a retry from the same process reuses
it (its own claim: at once), and any other producer takes the id over after the lease. The
lease (default: the retry budget plus one attempt's 20 s) must cover claim to send: a send
slower than that may be sent twice (at least once, never dropped). A claim expires
`window_seconds` after it was made (DynamoDB TTL removes it later; the condition compares
`expires_at` itself, since TTL deletes lazily).

Table `<namespace->messenger-dedup`: partition key `dedup_key`; attributes `token`, `state`
(CLAIMED, SENT), `lease_until` (epoch seconds), `claimed_at`, `expires_at` (TTL).

The flow a producer runs around its sends with these claims (which key, claim, mark or release)
is `messenger.jobs.enqueue_dedup.EnqueueDedup`.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import SQS_MAX_RETENTION_SECONDS, dedup_table_name
from messenger.errors import InvalidSettings, MessengerError
from messenger.jobs.tables import EXPIRES_AT, ensure_table, put_unless_held
from messenger.settings import Settings

logger = logging.getLogger("messenger.dedup")

DEFAULT_WINDOW_SECONDS = 300
MIN_WINDOW_SECONDS = 1
#: SQS's own deduplication interval on FIFO queues and topics (not configurable).
SQS_DEDUP_INTERVAL_SECONDS = 300
#: Deduplication ids an ordered producer remembers (the newest) to report SQS's own drops.
MAX_REMEMBERED_IDS = 100_000
#: The default lease is the retry budget plus this: one attempt past the budget (a 5 s connect
#: and a 15 s answer, `messenger.aws`), the longest a send may take once it started in time.
LEASE_MARGIN_SECONDS = 20.0
#: Claim states. An item without a state (written before leases) counts as SENT.
CLAIMED, SENT = "CLAIMED", "SENT"
#: DynamoDB's BatchWriteItem limit.
MAX_BATCH_WRITE = 25
#: Unreleased claims' tokens a store remembers (the newest), for a retry from the same process.
MAX_UNRELEASED = 10_000
#: push_many's failure code of an item whose id another producer's live claim holds.
HELD_CODE = "ClaimHeld"
#: Longest pause between two looks at a claim held elsewhere.
MAX_POLL_SECONDS = 1.0

# A claim succeeds on a free id, on our own unsent claim (a retry after a lost answer), on an
# unsent claim past its lease (its producer died or gave up) and on any claim past its window.
_CLAIM_CONDITION = (
    "attribute_not_exists(dedup_key) OR expires_at <= :now OR "
    "(#state = :claimed AND (#token = :token OR lease_until <= :now))"
)


def check_window(window_seconds: Any, owner: str = "dedup_window") -> int:
    """The window in whole seconds (1 to SQS's 14-day maximum retention); InvalidSettings else."""
    if isinstance(window_seconds, bool) or not isinstance(window_seconds, int) or \
            not MIN_WINDOW_SECONDS <= window_seconds <= SQS_MAX_RETENTION_SECONDS:
        raise InvalidSettings(
            f"{owner} must be a whole number of seconds from {MIN_WINDOW_SECONDS} to "
            f"{SQS_MAX_RETENTION_SECONDS} (the longest retention), got {window_seconds!r}"
        )
    return window_seconds


def check_lease(lease_seconds: Any, settings: Settings, owner: str = "dedup_lease") -> float:
    """The lease in seconds: `lease_seconds` (> 0, finite), or None for the default (the
    retry budget plus LEASE_MARGIN_SECONDS); InvalidSettings else."""
    if lease_seconds is None:
        return settings.retry_budget_seconds + LEASE_MARGIN_SECONDS
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float)) or \
            not math.isfinite(lease_seconds) or lease_seconds <= 0:
        raise InvalidSettings(f"{owner} must be a number of seconds > 0 (None: the retry "
                              f"budget + {LEASE_MARGIN_SECONDS:g} s), got {lease_seconds!r}")
    return float(lease_seconds)


@dataclass(frozen=True)
class Claim:
    """A claim made by this producer: marked SENT after its send, released if the send fails."""

    key: str
    token: str
    message_id: str = ""
    channel: str = ""
    claimed_at: float = 0.0
    expires_at: int = 0


@dataclass(frozen=True)
class Duplicate:
    """The claim that made a push a duplicate: when it was made (epoch seconds, 0 if unknown)."""

    key: str
    claimed_at: float


@dataclass(frozen=True)
class Held:
    """Another producer's claim, not marked SENT, within its lease (`lease_until`, epoch
    seconds): the id is being pushed elsewhere, and is neither sent here nor a duplicate."""

    key: str
    lease_until: float

    def describe(self) -> str:
        left = max(0.0, self.lease_until - time.time())
        return (f"message id {self.key.split('#', 1)[-1]!r} is being pushed by another producer "
                f"(its claim, not yet marked sent, holds for {left:.1f} s more); not sent: retry "
                f"after that (a sent message is then reported as a duplicate)")


class DedupTable:
    """The namespace's dedup table (producers' claims and the consumers' claims of fired
    scheduled jobs share it): its name, checked (created in `auto` provisioning) once."""

    def __init__(self, clients: ClientFactory, settings: Settings) -> None:
        self.clients = clients
        self.settings = settings
        self.name = dedup_table_name(settings.namespace)
        self._ready = False
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """Check the table once, within the retry budget (the first caller waits)."""
        with self._lock:
            if not self._ready:
                call_with_budget(
                    lambda: ensure_table(self.clients, self.settings, self.name, "dedup",
                                         "dedup_key"),
                    self.settings.retry_budget_seconds, f"checking table {self.name!r}")
                self._ready = True


class DedupStore:
    """Claims message ids in the dedup table (see the module doc); safe to share between
    threads.

    lease_seconds: how long an unsent claim holds off other producers (None: the retry budget
    plus LEASE_MARGIN_SECONDS; see `check_lease`)."""

    def __init__(self, clients: ClientFactory, settings: Settings,
                 lease_seconds: float | None = None) -> None:
        self.clients = clients
        self.settings = settings
        self._table = DedupTable(clients, settings)
        self.table = self._table.name
        self.lease_seconds = check_lease(lease_seconds, settings)
        self._lock = threading.Lock()
        #: key -> token of claims this store may hold unreleased (a failed release, or a claim
        #: whose answer never came): a retry of the key from this process reuses the token.
        self._unreleased: OrderedDict[str, str] = OrderedDict()

    def claim(self, channel: str, message_id: str, window_seconds: int,
              wait_until: float | None = None) -> Claim | Duplicate | Held:
        """Claim the id for `window_seconds`: a Claim (send, then `mark_sent`), the Duplicate
        that was sent, or the Held claim of another producer. wait_until: a `time.monotonic()`
        moment up to which a Held claim is looked at again (None: answer at once)."""
        self._table.ensure()
        key = f"{channel}#{message_id}"
        token = self._take_unreleased(key) or uuid.uuid4().hex
        pause = 0.05
        while True:
            try:
                verdict = self._try_claim(key, token, channel, message_id, window_seconds)
            except BaseException:
                self._remember_unreleased(key, token)  # the write may have landed
                raise
            if not isinstance(verdict, Held):
                return verdict
            now = time.monotonic()
            if wait_until is None or now >= wait_until:
                return verdict
            # Look again when the lease ends, or sooner: a SENT mark ends the wait early.
            time.sleep(max(0.0, min(pause, verdict.lease_until - time.time() + 0.01,
                                    wait_until - now)))
            pause = min(MAX_POLL_SECONDS, pause * 2)

    def _try_claim(self, key: str, token: str, channel: str, message_id: str,
                   window_seconds: int) -> Claim | Duplicate | Held:
        dynamodb = self.clients.client("dynamodb")
        for _ in range(3):  # a claim that lapsed between our clock and the write: once more
            now = time.time()
            claim = Claim(key, token, message_id, channel, now, int(now) + window_seconds)
            item = {**self._item(claim, CLAIMED),
                    "lease_until": {"N": repr(now + self.lease_seconds)}}
            request = {
                "TableName": self.table, "Item": item, "ConditionExpression": _CLAIM_CONDITION,
                "ExpressionAttributeNames": {"#state": "state", "#token": "token"},
                "ExpressionAttributeValues": {":now": {"N": repr(now)},
                                              ":claimed": {"S": CLAIMED}, ":token": {"S": token}},
            }
            # The same token on every attempt: a retry after a lost answer finds its own.
            old = put_unless_held(dynamodb, request, self.settings.retry_budget_seconds,
                                  f"claiming message id {message_id!r}")
            if old is None:
                return claim
            verdict = self._holder(key, old, time.time())
            if verdict is not None:
                return verdict
        return Held(key, time.time())  # kept changing under us: in progress elsewhere

    @staticmethod
    def _holder(key: str, old: dict[str, Any], now: float) -> Duplicate | Held | None:
        """What the item that failed the condition says, or None if it no longer holds."""
        if not old or float(old.get(EXPIRES_AT, {}).get("N", 0)) <= now:
            return None
        if old.get("state", {}).get("S", SENT) != CLAIMED:  # no state: the older schema's
            return Duplicate(key, float(old.get("claimed_at", {}).get("N", 0)))
        lease_until = float(old.get("lease_until", {}).get("N", 0))
        return Held(key, lease_until) if lease_until > now else None

    def _item(self, claim: Claim, state: str) -> dict[str, Any]:
        return {
            "dedup_key": {"S": claim.key}, "message_id": {"S": claim.message_id},
            "channel": {"S": claim.channel}, "claimed_at": {"N": repr(claim.claimed_at)},
            "token": {"S": claim.token}, "state": {"S": state},
            EXPIRES_AT: {"N": str(claim.expires_at)},
        }

    def mark_sent(self, claims: list[Claim]) -> None:
        """Mark claims whose messages were sent: a later push of their ids is a duplicate. One
        PutItem for one claim, else BatchWriteItem per 25. Unconditional: only a producer that
        sent writes SENT. A mark that fails is logged: the claim then holds until its lease, and
        a push of the id after that sends it again (a duplicate, never a drop)."""
        budget = self.settings.retry_budget_seconds
        dynamodb = self.clients.client("dynamodb")
        try:
            if len(claims) == 1:
                item = self._item(claims[0], SENT)
                call_with_budget(lambda: dynamodb.put_item(TableName=self.table, Item=item),
                                 budget, "marking a dedup claim sent")
                return
            unmarked = sum(
                self._write_batch([{"PutRequest": {"Item": self._item(claim, SENT)}}
                                   for claim in claims[first:first + MAX_BATCH_WRITE]], budget)
                for first in range(0, len(claims), MAX_BATCH_WRITE))
            if unmarked:
                logger.warning("dedup: %d claim(s) left unmarked within the retry budget (they "
                               "hold until their lease, %g s)", unmarked, self.lease_seconds)
        except (ClientError, BotoCoreError, MessengerError) as error:
            logger.warning("dedup: marking %d claim(s) sent failed (they hold until their "
                           "lease, %g s): %s", len(claims), self.lease_seconds, error)

    def _write_batch(self, requests: list[dict[str, Any]], budget: float) -> int:
        """Write up to 25 requests, again for what DynamoDB left unprocessed, within `budget`;
        the number still unprocessed."""
        dynamodb = self.clients.client("dynamodb")
        deadline = time.monotonic() + budget
        pause = 0.05
        while requests:
            answer = call_with_budget(
                functools.partial(dynamodb.batch_write_item, RequestItems={self.table: requests}),
                budget, "marking dedup claims sent")
            requests = answer.get("UnprocessedItems", {}).get(self.table, [])
            if requests:
                if time.monotonic() >= deadline:
                    return len(requests)
                time.sleep(pause)
                pause = min(MAX_POLL_SECONDS, pause * 2)
        return 0

    def release(self, claim: Claim) -> None:
        """Give a claim back (its send failed); only ours, never a newer producer's. If that
        fails, its token is kept for a retry from this process (see the module doc)."""
        try:
            self.clients.client("dynamodb").delete_item(
                TableName=self.table, Key={"dedup_key": {"S": claim.key}},
                ConditionExpression="#t = :t", ExpressionAttributeNames={"#t": "token"},
                ExpressionAttributeValues={":t": {"S": claim.token}})
        except (ClientError, BotoCoreError) as error:
            if error_code(error) == "ConditionalCheckFailedException":
                return  # taken over after the lease: no longer ours
            self._remember_unreleased(claim.key, claim.token)
            logger.warning("dedup: releasing claim %s failed (another producer may take it "
                           "over after its %g s lease; a retry from this process at once): %s",
                           claim.key, self.lease_seconds, error)

    def _remember_unreleased(self, key: str, token: str) -> None:
        with self._lock:
            self._unreleased.pop(key, None)
            self._unreleased[key] = token
            while len(self._unreleased) > MAX_UNRELEASED:
                self._unreleased.popitem(last=False)

    def _take_unreleased(self, key: str) -> str | None:
        with self._lock:
            return self._unreleased.pop(key, None)


class SentMarks:
    """Claims whose messages were sent, marked in BatchWriteItems of 25 (push_many's second
    write: 0.04 requests per message). Not thread-safe: one per call."""

    def __init__(self, store: DedupStore) -> None:
        self.store = store
        self._claims: list[Claim] = []

    def add(self, claim: Claim) -> None:
        self._claims.append(claim)
        if len(self._claims) >= MAX_BATCH_WRITE:
            self.flush()

    def flush(self) -> None:
        if self._claims:
            claims, self._claims = self._claims, []
            self.store.mark_sent(claims)


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
