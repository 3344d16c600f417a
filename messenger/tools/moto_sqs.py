"""An indexed message store for moto's SQS: a request costs the same whatever a queue's depth.

Stock moto 5.2.5 keeps a queue's messages in one list and scans it on every request: a send
computes every approximate count (three scans with `datetime` arithmetic per message, four
times per FIFO message), a receive lists every visible message and, per message returned,
computes the counts three more times; delete and ChangeMessageVisibility look a receipt handle
up by scanning. At 10,000 messages a batched send takes seconds. `apply()` replaces those
methods of `moto.sqs.models.Queue` / `SQSBackend` with ones that keep each queue's messages in
an index (`QueueIndex`):

- ready messages in a heap by arrival (standard queues), or one heap per message group plus a
  heap of the unlocked groups' heads (FIFO), so a receive pops what it returns and never looks
  at a locked group's backlog;
- leases (in-flight messages) and delayed messages in heaps by the time they become visible;
- receipt handles and FIFO deduplication ids in dicts; the approximate counts as counters;
- the CamelCase-to-snake_case names `Queue.attributes` converts on every read, remembered;
  a receipt handle drawn in one call (constant costs, but paid per message).

Clients see the answers stock moto gives (tests/integration/test_moto_sqs.py runs the same
calls on both), with three departures, each toward what SQS does:

1. FIFO: when the leases of several messages of one group lapse together, the group comes back
   in its order (stock moto returned the later message first).
2. FIFO: a long poll waiting while a group is locked wakes as soon as the lock is released
   (delete, visibility change or lapse); stock moto slept until the poll's end (up to 20 s).
   Any long poll also wakes when a lease lapses or a delay ends, not at the next 1 s tick.
3. A message past the queue's retention period is dropped, as SQS deletes it; stock moto kept
   it in the queue, leased but never returned. ChangeMessageVisibility with the latest handle
   of a message whose lease lapsed leases it again and, on a FIFO queue, locks its group
   (stock moto hid it without locking the group).

The layer is written against moto 5.2.5 (what requirements.txt pins): on any other version
`apply()` patches nothing and logs why, and the endpoint serves stock moto.
"""

from __future__ import annotations

import copy
import functools
import heapq
import itertools
import logging
import string
import time
from collections.abc import Generator
from typing import Any

#: The moto release these replacements were written against (and tested with).
MOTO_VERSION = "5.2.5"
#: SQS's FIFO deduplication window (moto's `DEDUPLICATION_TIME_IN_SECONDS`).
DEDUPLICATION_WINDOW_SECONDS = 300
#: Longest a long poll sleeps before it looks at the clock again (a guard; it is woken sooner).
MAX_POLL_SLEEP_SECONDS = 1.0

log = logging.getLogger(__name__)

_DELAYED, _READY, _LEASED, _GONE = "delayed", "ready", "leased", "gone"
_tokens = itertools.count(1)
_applied = False


def _now_ms() -> float:
    """moto's clock (`unix_time_millis`), which `Message.visible`/`delayed` compare against."""
    from moto.core.utils import unix_time_millis

    return unix_time_millis()


class QueueIndex:
    """Every message of one moto `Queue`, indexed by what each request looks for.

    A message is in exactly one state: delayed, ready (visible), leased (in flight) or gone.
    Each move gives it a new token; a heap entry whose token is no longer the message's is
    stale and skipped when it reaches the top (lazy deletion keeps every move O(log n))."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.arrivals = itertools.count()
        self.members: dict[int, Any] = {}  # id(message) -> message, in arrival order
        self.handles: dict[str, Any] = {}  # every receipt handle a member ever had
        self.dedup: dict[str, list[Any]] = {}  # FIFO deduplication id -> members
        self.ready: list[tuple[int, int, Any]] = []  # standard: (arrival, token, message)
        self.groups: dict[str, list[tuple[int, int, Any]]] = {}  # FIFO: backlog per group
        self.group_heads: list[tuple[int, str]] = []  # FIFO: (arrival of head, group)
        self.group_leases: dict[str, int] = {}  # FIFO: leased messages per locked group
        self.leases: list[tuple[float, int, Any]] = []  # (visible_at, token, message)
        self.delays: list[tuple[float, int, Any]] = []  # (delayed_until, token, message)
        self.counts = {_DELAYED: 0, _READY: 0, _LEASED: 0}

    # -- state moves -------------------------------------------------------------------------

    @property
    def fifo(self) -> bool:
        return bool(getattr(self.queue, "fifo_queue", False))

    def _enter(self, message: Any, state: str) -> int:
        old = getattr(message, "_index_state", _GONE)
        if old in self.counts:
            self.counts[old] -= 1
        if old == _LEASED and message.group_id is not None and self.fifo:
            self._unlease_group(message.group_id)
        message._index_state = state
        message._index_token = token = next(_tokens)
        if state in self.counts:
            self.counts[state] += 1
        return token

    def _unlease_group(self, group: str) -> None:
        left = self.group_leases.get(group, 0) - 1
        if left > 0:
            self.group_leases[group] = left
            return
        self.group_leases.pop(group, None)
        head = self._group_head(group)
        if head is not None:
            heapq.heappush(self.group_heads, (head[0], group))

    def _make_ready(self, message: Any) -> None:
        token = self._enter(message, _READY)
        entry = (message._index_arrival, token, message)
        if self.fifo and message.group_id is not None:
            backlog = self.groups.setdefault(message.group_id, [])
            heapq.heappush(backlog, entry)
            if message.group_id not in self.group_leases and backlog[0] is entry:
                heapq.heappush(self.group_heads, (entry[0], message.group_id))
        else:
            heapq.heappush(self.ready, entry)

    def _make_leased(self, message: Any) -> None:
        token = self._enter(message, _LEASED)
        heapq.heappush(self.leases, (message.visible_at, token, message))
        if self.fifo and message.group_id is not None:
            self.group_leases[message.group_id] = self.group_leases.get(message.group_id, 0) + 1

    def insert(self, message: Any, now: float) -> None:
        """Add a sent (or dead-lettered) message: delayed, or ready at once."""
        message._index_arrival = next(self.arrivals)
        self.members[id(message)] = message
        for handle in message.all_receipt_handles:
            if handle:
                self.handles[handle] = message
        if message.deduplication_id is not None:
            self.dedup.setdefault(message.deduplication_id, []).append(message)
        if now < message.delayed_until:
            token = self._enter(message, _DELAYED)
            heapq.heappush(self.delays, (message.delayed_until, token, message))
        else:
            self._make_ready(message)

    def remove(self, message: Any) -> None:
        """Take a message out (deleted, dead-lettered, expired)."""
        self._enter(message, _GONE)
        self.members.pop(id(message), None)
        for handle in message.all_receipt_handles:
            if self.handles.get(handle) is message:
                del self.handles[handle]
        same = self.dedup.get(message.deduplication_id)
        if same is not None:
            same.remove(message)
            if not same:
                del self.dedup[message.deduplication_id]

    def is_duplicate(self, message: Any) -> bool:
        """Stock moto's FIFO rule: a member with this deduplication id sent < 5 min before."""
        return any(
            (message.sent_timestamp - other.sent_timestamp) / 1000 < DEDUPLICATION_WINDOW_SECONDS
            for other in self.dedup.get(message.deduplication_id, ())
        )

    def release(self, now: float) -> None:
        """Leases that lapsed (`now > visible_at`) and delays that ended become ready."""
        while self.leases and self.leases[0][0] < now:
            _, token, message = heapq.heappop(self.leases)
            if message._index_token == token:
                self._make_ready(message)
        while self.delays and self.delays[0][0] <= now:
            _, token, message = heapq.heappop(self.delays)
            if message._index_token == token:
                self._make_ready(message)

    def next_change_in(self, now: float) -> float | None:
        """Seconds until the earliest lease lapses or delay ends (None: nothing pending)."""
        due = [heap[0][0] for heap in (self.leases, self.delays) if heap]
        return max(0.0, (min(due) - now) / 1000) if due else None

    def relocate(self, message: Any, now: float) -> None:
        """After a visibility change: leased while invisible, ready once visible."""
        if now < message.visible_at:
            self._make_leased(message)
        elif message._index_state != _READY:
            self._make_ready(message)

    # -- picking what a receive returns ------------------------------------------------------

    def _group_head(self, group: str) -> tuple[int, int, Any] | None:
        backlog = self.groups.get(group)
        while backlog and backlog[0][2]._index_token != backlog[0][1]:
            heapq.heappop(backlog)
        if not backlog:
            self.groups.pop(group, None)
            return None
        return backlog[0]

    def _pop_ready(self) -> Any | None:
        while self.ready:
            _, token, message = heapq.heappop(self.ready)
            if message._index_token == token:
                return message
        return None

    def candidates(self) -> Generator[Any, None, None]:
        """Ready messages in arrival order; on a FIFO queue only of groups unlocked when the
        receive began (a receive may return several messages of one group, as SQS does)."""
        if not self.fifo:
            while (message := self._pop_ready()) is not None:
                yield message
            return
        opened: list[tuple[int, str]] = []  # groups this receive has taken from
        try:
            while True:
                while self.group_heads:
                    arrival, group = self.group_heads[0]
                    head = self._group_head(group) if group not in self.group_leases else None
                    if head is not None and head[0] == arrival:
                        break
                    heapq.heappop(self.group_heads)  # stale: locked, emptied or moved on
                source = min(
                    (h for h in (self.group_heads, opened) if h), key=lambda h: h[0], default=None
                )
                if source is None:
                    return
                arrival, group = heapq.heappop(source)
                head = self._group_head(group)
                if head is None or head[0] != arrival:
                    continue
                heapq.heappop(self.groups[group])
                message = head[2]
                following = self._group_head(group)
                if following is not None:
                    heapq.heappush(opened, (following[0], group))
                yield message
        finally:
            for _, group in opened:  # groups left unlocked go back among the heads
                head = self._group_head(group)
                if head is not None and group not in self.group_leases:
                    heapq.heappush(self.group_heads, (head[0], group))

    def take_from_backlog(self, message: Any) -> None:
        """A candidate popped from a heap leaves the ready state (leased or removed next)."""
        self.counts[_READY] -= 1
        message._index_state = _GONE
        message._index_token = next(_tokens)

    def ordered(self, state: str | None = None) -> list[Any]:
        """Members (in one state) in arrival order: for code paths that want a list."""
        return [m for m in self.members.values() if state is None or m._index_state == state]


def index_of(queue: Any) -> QueueIndex:
    index = queue.__dict__.get("_index")
    if index is None:
        index = queue.__dict__["_index"] = QueueIndex(queue)
    return index


def _lock(queue: Any) -> Any:
    return queue._messages_lock


# -- replacements for moto.sqs.models.Queue ---------------------------------------------------


def _get_messages_list(self: Any) -> list[Any]:
    return index_of(self).ordered()


def _set_messages_list(self: Any, messages: list[Any]) -> None:
    """`queue._messages = [...]` (moto's __init__ and purge): start the index afresh."""
    index = QueueIndex(self)
    self.__dict__["_index"] = index
    now = _now_ms()
    for message in messages:
        index.insert(message, now)


def _pending_messages(self: Any) -> set[Any]:
    index = index_of(self)
    with _lock(self):
        index.release(_now_ms())
        return set(index.ordered(_LEASED))


def _pending_message_groups(self: Any) -> set[str]:
    return {m.group_id for m in _pending_messages(self) if m.group_id is not None}


def _count(state: str) -> Any:
    def count(self: Any) -> int:
        index = index_of(self)
        with _lock(self):
            index.release(_now_ms())
            return index.counts[state]

    return property(count)


def _visible_messages(self: Any) -> list[Any]:
    index = index_of(self)
    with _lock(self):
        index.release(_now_ms())
        return index.ordered(_READY)


def _add_message(self: Any, message: Any) -> None:
    index = index_of(self)
    with _lock(self):
        if (
            self.fifo_queue
            and (getattr(self, "content_based_deduplication", False) or message.deduplication_id)
            and index.is_duplicate(message)
        ):
            return
        index.insert(message, _now_ms())
        self._messages_lock.notify_all()
    if self.lambda_event_source_mappings:
        _invoke_event_source_mappings(self)


def _invoke_event_source_mappings(queue: Any) -> None:
    """Stock moto's Lambda event source mapping step of `add_message`, unchanged."""
    from moto.awslambda.utils import get_backend
    from moto.sqs.models import sqs_backends

    for arn, esm in queue.lambda_event_source_mappings.items():
        if not esm.enabled:
            continue
        backend = sqs_backends[queue.account_id][queue.region]
        messages = backend.receive_message(
            queue.name,
            esm.batch_size,
            queue.receive_message_wait_time_seconds,
            queue.visibility_timeout,
        )
        result = get_backend(queue.account_id, queue.region).send_sqs_batch(
            arn, messages, queue.queue_arn
        )
        for m in messages:
            if result:
                backend.delete_message(queue.name, str(m.receipt_handle))
            else:
                backend.change_message_visibility(queue.name, str(m.receipt_handle), 0)


def _delete_message(self: Any, receipt_handle: str) -> None:
    from moto.sqs.exceptions import ReceiptHandleIsInvalid

    if receipt_handle in self.deleted_messages:
        return  # already deleted: SQS accepts a second delete
    index = index_of(self)
    with _lock(self):
        message = index.handles.get(receipt_handle)
        if message is None:
            raise ReceiptHandleIsInvalid()
        index.remove(message)
        self.deleted_messages.update(message.all_receipt_handles)
        self._messages_lock.notify_all()  # a FIFO group may have unlocked


def _wait_for_messages(self: Any, timeout: int) -> None:
    index = index_of(self)
    with _lock(self):
        self._messages_lock.wait_for(lambda: index.counts[_READY], timeout=timeout)


# -- replacements for moto.sqs.models.SQSBackend ----------------------------------------------


def _receive_message(
    self: Any,
    queue_name: str,
    count: int,
    wait_seconds_timeout: int,
    visibility_timeout: int,
    message_attribute_names: list[str] | None = None,
) -> list[Any]:
    """Return up to `count` ready messages, leased for `visibility_timeout` s; a long poll
    (`wait_seconds_timeout` > 0) sleeps until one is ready or the time is up."""
    queue = self.get_queue(queue_name)
    deadline = time.monotonic() + wait_seconds_timeout
    while True:
        with _lock(queue):
            index = index_of(queue)  # afresh each round: a purge replaces the index
            now = _now_ms()
            index.release(now)
            result, to_dead_letter = _take(queue, index, count, visibility_timeout, now)
            if result:
                queue._messages_lock.notify_all()
            left = deadline - time.monotonic()
            if not result and not to_dead_letter and wait_seconds_timeout and left > 0:
                due = index.next_change_in(now)
                nap = min(left, MAX_POLL_SLEEP_SECONDS, due if due is not None else left)
                queue._messages_lock.wait(timeout=max(nap, 0.001))
                continue
        for message in to_dead_letter:  # outside this queue's lock: the DLQ takes its own
            queue.dead_letter_queue.add_message(message)
        if result or not wait_seconds_timeout or time.monotonic() >= deadline:
            return [_response_copy(m, message_attribute_names or []) for m in result]


def _take(
    queue: Any, index: QueueIndex, count: int, visibility_timeout: int, now: float
) -> tuple[list[Any], list[Any]]:
    """Stock moto's selection, per message: dead-letter when received maxReceiveCount times,
    else lease. Runs under the queue's lock."""
    result: list[Any] = []
    to_dead_letter: list[Any] = []
    back_to_ready: list[Any] = []
    policy = queue.redrive_policy if queue.dead_letter_queue is not None else None
    retention_ms = int(queue.message_retention_period) * 1000
    candidates = index.candidates()
    try:
        for message in candidates:
            index.take_from_backlog(message)
            if message.sent_timestamp + retention_ms <= now:
                index.remove(message)
                continue
            if policy and message.approximate_receive_count >= policy["maxReceiveCount"]:
                index.remove(message)
                to_dead_letter.append(message)
                continue
            message.mark_received(visibility_timeout=visibility_timeout)
            message.messenger_received_ms = now  # SQS's 12 hours in flight count from here
            index.handles[message.receipt_handle] = message
            if visibility_timeout:
                index.relocate(message, now)
            else:
                back_to_ready.append(message)  # visible at once, but not twice in one answer
            result.append(message)
            if len(result) >= count:
                break
    finally:
        candidates.close()  # puts the groups this receive opened back among the heads
    for message in back_to_ready:
        index._make_ready(message)
    return result, to_dead_letter


def _response_copy(message: Any, attribute_names: list[str]) -> Any:
    """What the response shows: the message with only the asked-for message attributes
    (stock moto deep-copied the whole message; the filter replaces the dict, so a shallow
    copy leaves the stored message as it was)."""
    from moto.sqs.models import _filter_message_attributes

    shown = copy.copy(message)
    _filter_message_attributes(shown, attribute_names)
    return shown


def _change_message_visibility(
    self: Any, queue_name: str, receipt_handle: str, visibility_timeout: int
) -> None:
    from moto.sqs.exceptions import InvalidParameterValue, ReceiptHandleIsInvalid

    queue = self.get_queue(queue_name)
    index = index_of(queue)
    with _lock(queue):
        message = index.handles.get(receipt_handle)
        if message is None:
            raise ReceiptHandleIsInvalid
        now = _now_ms()
        # AWS: at most 12 hours in flight since the receive ("a total visibility timeout of
        # 12 hours"); stock moto counted from the send, refusing a valid extension of a message
        # that waited in the queue
        received = getattr(message, "messenger_received_ms", message.sent_timestamp)
        if now + int(visibility_timeout) * 1000 - received > 43200 * 1000:
            raise InvalidParameterValue(
                f"Value {visibility_timeout} for parameter VisibilityTimeout is invalid. Reason: "
                "Total VisibilityTimeout for the message is beyond the limit [43200 seconds]"
            )
        index.release(now)
        message.change_visibility(visibility_timeout)
        index.relocate(message, _now_ms())
        queue._messages_lock.notify_all()


def _receipt_handle() -> str:
    """Stock's receipt handle (185 random lowercase letters, from moto's seedable random) in
    one call instead of 185."""
    from moto.moto_api._internal import mock_random

    return "".join(mock_random.choices(string.ascii_lowercase, k=185))


def _retention_check(self: Any, queue_name: str, message: Any) -> bool:
    """Stock's check without computing every queue attribute three times."""
    queue = self.get_queue(queue_name)
    retain_until = int(queue.message_retention_period) + message.sent_timestamp / 1000
    return retain_until > _now_ms() / 1000


#: What `apply()` installs on moto's `Queue`: storage, counts, add and delete.
QUEUE_REPLACEMENTS: dict[str, Any] = {
    "_messages": property(_get_messages_list, _set_messages_list),
    "_pending_messages": property(_pending_messages, lambda self, value: None),
    "pending_messages": property(_pending_messages),
    "pending_message_groups": property(_pending_message_groups),
    "messages": property(_visible_messages),
    "approximate_number_of_messages": _count(_READY),
    "approximate_number_of_messages_not_visible": _count(_LEASED),
    "approximate_number_of_messages_delayed": _count(_DELAYED),
    "add_message": _add_message,
    "delete_message": _delete_message,
    "wait_for_messages": _wait_for_messages,
}
#: What `apply()` installs on moto's `SQSBackend`: receive and visibility changes.
BACKEND_REPLACEMENTS: dict[str, Any] = {
    "receive_message": _receive_message,
    "change_message_visibility": _change_message_visibility,
    "is_message_valid_based_on_retention_period": _retention_check,
}


def apply() -> bool:
    """Install the index into moto's SQS (idempotent). Returns False, logging why, when the
    installed moto is not the version this layer was written for."""
    global _applied
    if _applied:
        return True
    import moto

    if moto.__version__ != MOTO_VERSION:
        log.warning(
            "messenger: moto %s is installed, the SQS index is written for moto %s: not "
            "applied; the local endpoint serves stock moto (request cost grows with queue depth)",
            moto.__version__,
            MOTO_VERSION,
        )
        return False
    from moto.sqs import models

    for owner, replacements in (
        (models.Queue, QUEUE_REPLACEMENTS),
        (models.SQSBackend, BACKEND_REPLACEMENTS),
    ):
        for name, replacement in replacements.items():
            setattr(owner, name, replacement)
    # `Queue.attributes` (read up to 5 times per FIFO message sent) converts each of its ~20
    # names from CamelCase with a character loop: same answers, remembered.
    models.camelcase_to_underscores = functools.lru_cache(maxsize=256)(  # type: ignore[assignment]
        models.camelcase_to_underscores
    )
    models.generate_receipt_handle = _receipt_handle
    _applied = True
    log.info("messenger: moto %s SQS index applied", MOTO_VERSION)
    return True
