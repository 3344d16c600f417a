"""The consumer runtime's receiving part (`Receiving`, a part of `messenger.consume.runtime.
Runtime`): the receiver's loop, how many messages each poll asks for (the bounded prefetch,
receives beside the receiver's on a backlog, coalescing free workers into fuller polls), the
poll itself (a level poller's on a prioritized channel, or `poll`, the place to add sources),
and the messages that waited too long for a worker (`take_overdue`, released by the watchdog).
What a poll brought goes to `Runtime._dispatch` (the workers, or the receiver itself)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from typing import Any

from messenger.aws import is_transient
from messenger.consume.mailbox import Delivery, Mailbox, Stage
from messenger.consume.parts import RuntimeParts

#: How long the receiver waits for one more worker to free up before polling for fewer messages,
#: and at most in all.
COALESCE_SECONDS = 0.02
MAX_COALESCE_SECONDS = 0.25
RECEIVE_BACKOFF_SECONDS = 2.0


class Receiving(RuntimeParts):
    """The receiver's side of the runtime (module doc)."""

    def _receive_loop(self) -> None:
        me = threading.current_thread()
        while not self.stopping.is_set() and self._receiver is me:
            with self._cond:
                count, beside = self._to_fetch()
            if self.stopping.is_set():
                return
            if count <= 0:
                continue
            if beside is not None:
                # Prefetching on a backlog: this receive goes out on a thread of its own, so
                # that this one plans the next while it is in flight.
                receive = functools.partial(self._receive_beside, beside, count)
                threading.Thread(target=self._guarded(receive), name="messenger-receive",
                                 daemon=True).start()
                continue
            if self.consumer.ordered:
                # A group stays locked until its message is deleted: delete before polling.
                self.deleter.flush()
            deliveries = self._receive(count)
            if deliveries is not None:
                self._dispatch(deliveries)

    def _receive(self, count: int, wait_seconds: int | None = None) -> list[Delivery] | None:
        """One receive of at most `count` messages (a long poll of `wait_seconds`, None: the
        consumer's `wait_time_seconds`), timed for the prefetch. None when it failed (transient:
        after RECEIVE_BACKOFF_SECONDS; else the consumer stops) or came back after stop (its
        messages are released at once)."""
        try:
            began = time.monotonic()
            deliveries = self.fetch(count, wait_seconds)
            with self._lock:
                self.prefetch.observe_poll(time.monotonic() - began, count, len(deliveries))
            self._last_poll_dry = not deliveries
            self._last_poll_trickle = 0 < len(deliveries) < count
        except Exception as error:
            if not is_transient(error):  # queue gone, access denied: let ECS see it
                self.fail(error)
                return None
            self.consumer.emit(
                "receive_failed",
                fields={"error": f"{type(error).__name__}: {error}",
                        "transient": is_transient(error)},
            )
            self.stopping.wait(RECEIVE_BACKOFF_SECONDS)
            return None
        if self.stopping.is_set():
            # A long poll that returned after shutdown: give its messages back at once.
            self._release(deliveries, reason="shutdown")
            return None
        return deliveries

    def _receive_beside(self, key: int, count: int) -> None:
        """A receive sent while others may be in flight (`_to_fetch` counted it in
        `_in_flight` under `key`), on its own thread: its messages go to the workers (never run
        on this thread), then the receiver plans again. It is a short poll: a backlog answers
        it at once, and a queue run dry answers it empty at once (the poll then counts as short:
        one receive at a time again), rather than several long polls waiting side by side on an
        empty queue, each left waiting there by a consumer killed meanwhile (to take a message
        when its lease lapses, for nobody). An overridden `poll` is asked as before."""
        try:
            wait = 0 if type(self).poll is Receiving.poll else None
            deliveries = self._receive(count, wait)
            if deliveries:  # (an empty one: the receiver's next long poll tells if it is idle)
                self._dispatch(deliveries, inline=False)
        finally:
            with self._cond:
                del self._in_flight[key]
                self._cond.notify_all()

    def _to_fetch(self) -> tuple[int, int | None]:
        """How many messages to ask for, once there is a worker to fetch for (0: stopping), and
        whether that receive goes out beside others (its key in `_in_flight`, for
        `_receive_beside`; None: on the receiver's thread, nothing else in flight). Holds
        `_cond`. Prefetch (`messenger.consume.prefetch`): for the free workers and those
        expected to free up by the time the poll answers, up to MAX_RECEIVES_IN_FLIGHT
        receives at once while the polls come back full; else for the free workers only,
        waiting briefly for more of them (`_coalesce`), one receive at a time."""
        wanted = min(10, self.config.concurrency)
        while not self.stopping.is_set():
            if self.paused is not None:  # an operator paused the channel: no new receive
                self._cond.wait(0.5)
                continue
            now = time.monotonic()
            busy = self._chain_seconds
            if busy is not None and self.prefetch.active(now, busy):
                started, waiting = self._running_and_waiting()
                plan = self.prefetch.plan(now, self.config.concurrency - len(self._stuck),
                                          started, waiting, busy, wanted,
                                          list(self._in_flight.values()))
                if plan.count > 0 and self.poller is None and self.prefetch.last_full:
                    # (A prioritized channel's level poller picks levels one poll at a time.)
                    key = next(self._receive_keys)
                    self._in_flight[key] = (now, plan.count)
                    return plan.count, key
                if plan.count > 0:  # the plan asks for nothing more while one is in flight
                    return plan.count, None
                self._cond.wait(0.5 if plan.wait is None else min(0.5, plan.wait))
            elif self._in_flight:
                self._cond.wait(0.5)  # one receive at a time: wait for those in flight
            elif self.free_slots() > 0:
                self._coalesce()
                return min(wanted, self.free_slots()), None
            else:
                self._cond.wait(0.5)
        return 0, None

    def _running_and_waiting(self) -> tuple[list[float], int]:
        """When each held message running started, and how many wait for a worker. Holds
        `_cond`."""
        started: list[float] = []
        waiting = 0
        for delivery in self._held.values():
            if delivery.stage is Stage.QUEUED:
                waiting += 1
            elif delivery.stage is Stage.RUNNING and delivery.started_at is not None:
                started.append(delivery.started_at)
        return started, waiting

    def _coalesce(self) -> None:
        """Workers finish close together: while they keep freeing up (a slot every
        COALESCE_SECONDS at least), wait for a fuller batch, up to MAX_COALESCE_SECONDS. Fewer,
        fuller polls: ~0.1 receives per message on a backlog instead of ~0.15. Holds `_cond`."""
        wanted = min(10, self.config.concurrency)
        give_up = time.monotonic() + MAX_COALESCE_SECONDS
        while self._held and not self.stopping.is_set():
            free = self.free_slots()
            if free >= wanted or time.monotonic() >= give_up:
                return
            self._cond.wait(COALESCE_SECONDS)
            if self.free_slots() == free:
                return  # nothing finished meanwhile: the rest is busy for longer

    def poll(self, count: int, wait_seconds: int | None = None) -> list[dict[str, Any]]:
        """One long poll for at most `count` messages, waiting up to `wait_seconds` (None: the
        consumer's `wait_time_seconds`) (the place to add more sources, with or without
        `wait_seconds`; a prioritized channel's levels are polled by `self.poller` instead)."""
        wait = self.config.wait_time_seconds if wait_seconds is None else wait_seconds
        return self.mailbox.receive(count, wait, self.visibility)

    def fetch(self, count: int, wait_seconds: int | None = None) -> list[Delivery]:
        """At most `count` messages: one level's (prioritized channel) or one `poll`'s, waiting
        up to `wait_seconds` (None: the consumer's `wait_time_seconds`)."""
        if self.poller is not None:
            wait = self.config.wait_time_seconds if wait_seconds is None else wait_seconds
            batch = self.poller.poll(count, wait, self.visibility)
            return self.deliveries(batch.messages, batch.polled_at, batch.mailbox)
        polled_at = time.monotonic()
        raw = self.poll(count) if wait_seconds is None else self.poll(count, wait_seconds)
        return self.deliveries(raw, polled_at, self.mailbox)

    def deliveries(
        self, raw: list[dict[str, Any]], polled_at: float, mailbox: Mailbox
    ) -> list[Delivery]:
        # SQS starts the lease when it hands the message out: at most a round trip before now
        # (counted as up to 1 s, never before the poll began).
        now = time.monotonic()
        leased_at = max(polled_at, now - 1.0)
        return [Delivery(m, now, leased_at + self.visibility, mailbox=mailbox,
                         handed_out_after=polled_at) for m in raw]

    def take_overdue(self, now: float) -> tuple[list[Delivery], float | None]:
        """The messages that have waited `prefetch_wait` or longer for a worker while every
        worker was busy, claimed for `release_overdue` (prefetching pauses: this consumer's
        predictions were off); and when the next one comes due (None: none waits). The
        watchdog calls this at every tick and when the next one comes due."""
        limit = self.config.prefetch_wait
        if limit <= 0:
            return [], None
        chains, oldest = self._work.overdue(now - limit)
        if chains:
            self.prefetch.pause(now)
        overdue = [d for chain in chains for d in chain if d.claim(Stage.QUEUED, Stage.DONE)]
        return overdue, None if oldest is None else oldest + limit

    def release_overdue(self, deliveries: Sequence[Delivery]) -> None:
        """Make the messages `take_overdue` took visible again at once."""
        self._release(deliveries, reason="prefetch_expired")

    def _chains(self, deliveries: list[Delivery]) -> list[list[Delivery]]:
        if not self.consumer.ordered:
            return [[d] for d in deliveries]
        groups: dict[str | None, list[Delivery]] = {}
        for delivery in deliveries:
            groups.setdefault(delivery.group_id, []).append(delivery)
        return list(groups.values())
