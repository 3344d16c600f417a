"""Dedup on enqueue as a producer runs it, around its sends (the table and its claims:
`messenger.jobs.dedup`).

A push's dedup key is its deduplication id on an ordered channel, else the message id it names
(`EnqueueDedup.key`). Before the send the key is claimed (`claim_for_push`, `claim_batch`);
after it the claim is marked SENT, or given back when nothing was sent (`sending`, `settle`):
so a push is a duplicate only of a message that was sent, and a failed send leaves its id free
for a retry. An ordered producer also remembers the deduplication ids it sent in SQS's own
5-minute interval (`RecentIds`): SQS drops a repeat, so it is reported as a duplicate.

Nothing here knows the producer's types: items are named by their index in a call.
"""

from __future__ import annotations

import time
from collections.abc import Container, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from messenger.errors import InvalidMessage, PublishFailed
from messenger.jobs.dedup import Claim, DedupStore, Duplicate, Held, RecentIds, SentMarks


@dataclass
class BatchClaims:
    """What claiming the keys of one batch gave, by item index: the items to send (`ready`:
    those without a key, and those claimed, with their claim in `claims`), the duplicates, the
    ids another producer's claim holds (`held`) and the claims that failed (`errors`)."""

    ready: list[int] = field(default_factory=list)
    claims: dict[int, Claim] = field(default_factory=dict)
    duplicates: list[int] = field(default_factory=list)
    held: dict[int, Held] = field(default_factory=dict)
    errors: dict[int, Exception] = field(default_factory=dict)


class EnqueueDedup:
    """One producer's dedup on enqueue: which key a push claims, the claim before its send, and
    the mark (or release) after it. Thread-safe as its store and `RecentIds` are.

    store: the dedup table's claims; channel: the producer's channel (keys are
    '<channel>#<key>'); window_seconds: how long a sent id counts as taken; enabled: the
    producer's `dedup` (a push may override it); ordered: remember deduplication ids sent in
    SQS's 5 minutes; retry_budget: how long a push waits on an id held elsewhere."""

    def __init__(self, store: DedupStore, channel: str, window_seconds: int, enabled: bool,
                 ordered: bool, retry_budget: float) -> None:
        self.store = store
        self.channel = channel
        self.window = window_seconds
        self.enabled = enabled
        self.retry_budget = retry_budget
        #: Ordered channels: deduplication ids sent in SQS's own 5-minute interval.
        self.recent_ids = RecentIds() if ordered else None

    def wanted(self, dedup: Any) -> Any:
        """A push's dedup setting (None: the producer's), unchecked."""
        return self.enabled if dedup is None else dedup

    def key(self, dedup_id: str | None, message_id: str | None, dedup: bool | None,
            taken: set[str]) -> Duplicate | str | None:
        """Whether a push repeats one within the window: a Duplicate (do not send), the key to
        claim before sending, or None (no check applies). dedup_id: its deduplication id
        (ordered channels); message_id: the id the caller named; taken: deduplication ids
        earlier in this call (added to).

        Ordered channels: a deduplication id sent by this producer in SQS's 5 minutes (or
        earlier in this call) is a duplicate SQS would drop; with dedup on, the table is asked
        too (for other producers), by deduplication id. Standard channels: with dedup on, the
        table is asked by message id, when the push names one."""
        wanted = self.wanted(dedup)
        if not isinstance(wanted, bool):
            raise InvalidMessage(f"dedup must be True, False or None, got {dedup!r}")
        key = dedup_id
        if key is not None:
            if key in taken or (self.recent_ids is not None and self.recent_ids.seen(key)):
                return Duplicate(key, 0.0)
            taken.add(key)
        elif message_id is not None:
            key = message_id
        if not wanted or key is None:
            return None
        return key

    def claim(self, key: str, wait_until: float | None) -> Claim | Duplicate | Held:
        """Claim `key` (see `DedupStore.claim`)."""
        return self.store.claim(self.channel, key, self.window, wait_until)

    def claim_for_push(self, verdict: Duplicate | str | None) -> Claim | Duplicate | None:
        """One push's claim of its `key` verdict: a Claim (send it, within `sending`), the
        Duplicate, or None (no check). An id held by another producer's push in flight is
        waited on, within the retry budget, until sent there (a duplicate) or given up (ours);
        still held: PublishFailed (not sent; never a duplicate unsent)."""
        if not isinstance(verdict, str):
            return verdict
        claimed = self.claim(verdict, time.monotonic() + self.retry_budget)
        if isinstance(claimed, Held):
            raise PublishFailed(claimed.describe())
        return claimed

    @contextmanager
    def sending(self, claim: Claim | Duplicate | None) -> Iterator[None]:
        """Around one send: its claim is marked SENT when the send returns, and given back when
        it raises (not sent: a retry is not a duplicate)."""
        if not isinstance(claim, Claim):
            yield
            return
        try:
            yield
        except BaseException:
            self.store.release(claim)
            raise
        self.store.mark_sent([claim])

    def claim_batch(self, keys: Iterable[tuple[int, str | None]],
                    wait_until: float | None) -> BatchClaims:
        """Claim the keys of one batch's items, (index, key or None); failures are reported
        per item, never raised (wait_until: see `DedupStore.claim`)."""
        found = BatchClaims()
        for index, key in keys:
            if key is None:
                found.ready.append(index)
                continue
            try:
                verdict = self.claim(key, wait_until)
            except Exception as error:  # reported per item, never raised
                found.errors[index] = error
                continue
            if isinstance(verdict, Duplicate):
                found.duplicates.append(index)
            elif isinstance(verdict, Held):
                found.held[index] = verdict
            else:
                found.claims[index] = verdict
                found.ready.append(index)
        return found

    def settle(self, claims: Mapping[int, Claim], sent: Container[int],
               marks: SentMarks) -> None:
        """After a batch's send: claims of the items `sent` go to `marks` (marked SENT in
        batches), the others are given back (not sent: a retry is not a duplicate)."""
        for index, claim in claims.items():
            if index in sent:
                marks.add(claim)
            else:
                self.store.release(claim)

    def marks(self) -> SentMarks:
        """The SENT marks of one push_many call (flush them before waiting on held ids)."""
        return SentMarks(self.store)

    def remember(self, dedup_ids: Iterable[str | None]) -> None:
        """Deduplication ids just sent (ordered channels): a repeat within SQS's interval is
        a duplicate."""
        if self.recent_ids is not None:
            self.recent_ids.add([dedup_id for dedup_id in dedup_ids if dedup_id])
