"""What `push_many` takes and returns: items, per-item failures and the result."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from messenger.errors import PublishFailed
from messenger.produce.transport import OutgoingMessage


@dataclass(frozen=True)
class PushItem:
    """One message of `push_many`."""

    body: Any
    routing_key: str | None = None
    #: Ordered channel: the FIFO message group. Standard channel: the fair-queue tenant key
    #: (e.g. a customer id), so one tenant's backlog does not delay the others.
    group_id: str | None = None
    dedup_id: str | None = None
    meta_headers: Mapping[str, str] | None = None
    priority: str | None = None
    #: The caller's own id (e.g. an order number): a retry after a crash reuses it. On an
    #: ordered channel it is also the deduplication key unless `dedup_id` is given.
    message_id: str | None = None
    #: Runs the job gets before its consumer dead-letters it, 1 to the channel's max_receives
    #: (None: the consumer's `max_attempts`).
    max_attempts: int | None = None
    #: Dedup on enqueue for this item (None: the producer's `dedup`); see `Producer.push`.
    dedup: bool | None = None


class PushedId(str):
    """What `push` returns: the message id (a str), and whether the push was a duplicate that
    was not sent (`duplicate`: the id was pushed within the dedup window already). A push with
    `at=`/`delay=` also says when the job is due (`due`, UTC; None: now) and whether it waits
    as a one-time schedule (`scheduled`; False: SQS's DelaySeconds, or sent now). A scheduled
    push whose job id is scheduled already on the channel is a duplicate too: nothing was
    scheduled, and `due` is the waiting job's due time (None: it fired or was cancelled)."""

    duplicate: bool
    due: datetime | None
    scheduled: bool

    def __new__(cls, message_id: str, duplicate: bool = False, due: datetime | None = None,
                scheduled: bool = False) -> PushedId:
        made = super().__new__(cls, message_id)
        made.duplicate = duplicate
        made.due = due
        made.scheduled = scheduled
        return made


@dataclass(frozen=True)
class PreparedItem:
    """An item ready to send: its input index, wire form, id and priority level."""

    index: int
    outgoing: OutgoingMessage
    message_id: str
    level: str | None


@dataclass(frozen=True)
class PushFailure:
    """An item `push_many` could not deliver: its index in the input and why."""

    index: int
    code: str
    reason: str


@dataclass
class PushManyResult:
    """message_ids[i] is the id of input item i, or None when it failed (see `failures`). A
    duplicate (its index in `duplicates`) has the id of the message it repeats and was not
    sent: `published` does not count it."""

    message_ids: list[str | None] = field(default_factory=list)
    failures: list[PushFailure] = field(default_factory=list)
    offloaded: int = 0
    #: Indexes of the items not sent because their id was pushed within the dedup window (or,
    #: on an ordered channel, their deduplication id within SQS's 5 minutes).
    duplicates: list[int] = field(default_factory=list)

    @property
    def published(self) -> int:
        sent = sum(1 for message_id in self.message_ids if message_id is not None)
        return sent - len(self.duplicates)

    def raise_for_failures(self) -> None:
        if self.failures:
            first = self.failures[0]
            raise PublishFailed(
                f"{len(self.failures)} of {len(self.message_ids)} messages failed; first: "
                f"item {first.index}: {first.code}: {first.reason}"
            )
