"""The consumer's runtime: a receiver thread, worker threads and a watchdog thread.

- The receiver long-polls (20 s) for at most 10 messages: for the free workers and, with the
  bounded prefetch (`messenger.consume.prefetch`), for the workers expected to free up by the
  time the poll answers; a message that waits `prefetch_wait` (0.5 s) for a worker all the same
  is released by the watchdog (`take_overdue`), the waiting ones at once at shutdown. While
  prefetching on a backlog (polls coming back full), up to MAX_RECEIVES_IN_FLIGHT receives are
  in flight at once, each a short poll beside the receiver on a thread of its own
  (`_receive_beside`: its messages go to the workers), so that workers getting through more
  than 10 messages per round trip are kept busy; else one at a time, on the receiver's thread.
  On an ordered channel (no prefetch) a poll's messages of one group form a chain that one worker
  runs in order (SQS hands out a group's next message only after the previous one is deleted
  or visible again). On a prioritized channel a `LevelPoller`
  (`messenger.jobs.priority`) chooses the level of each poll; every delivery remembers its mailbox,
  so it is deleted, extended, retried and dead-lettered in its own level's queue and DLQ.
- Received messages wait in a work queue for a worker. When a poll's messages would take at
  most HANDOFF_SECONDS (at the median time of the last chains), the receiver runs them itself
  and then polls again (waking a thread costs more CPU than a fast message); else it wakes a
  worker for each chain. A receiver still running a poll's messages RESCUE_SECONDS later (a
  surprise slow handler) is replaced at the watchdog's next tick: idle workers take the rest of
  the poll, a new receiver thread polls, the old one exits when its handler returns.
  CPU optimisation: the plain path is receive → a worker per chain → handler → delete; running
  fast polls on the receiver (`workers_to_wake`, `_run_here`, `rescue_receiver`) and waking the
  deleter once per batch meanwhile (`DeleteBatcher.deferred_wakes`) only save CPU.
- A worker runs a message through the outcome policy (`messenger.consume.outcome`, shared with
  the Lambda runtime: decode, the handler under its timeout, the verdict), then queues it for
  deletion (completed, duplicate) or lets it go (retried, dead-lettered). A handler that returns
  past its deadline timed out: its message is dead-lettered, never deleted as a success.
- A completed message stays leased until SQS confirms its delete: a delete that fails
  transiently (throttled past the retry budget, an SQS error) is tried again while the lease
  keeper renews the lease; one SQS refuses for good (the receipt handle is no longer valid)
  is reported as `delete_failed` and dropped.
- The lease keeper (`messenger.consume.lease`) extends leases on its own thread, started first.
- The watchdog (`messenger.consume.watchdog`) times out handlers; the delete batcher sends
  deletes on its own thread.
- The control watcher (`messenger.consume.controls`) reads an operator's pause and cancel
  requests once per heartbeat interval: paused, the receiver stops polling (what is held
  finishes; the state is PAUSED once nothing is); a cancelled running message's deadline is
  moved to now, and the watchdog stops it as a processing timeout, 'cancelled by <who>'.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from messenger.aws import is_transient
from messenger.consume import decision
from messenger.consume.controls import ControlWatcher, stop_now
from messenger.consume.decision import Action
from messenger.consume.host import RuntimeHost
from messenger.consume.lease import LeaseKeeper, lapse_event, lease_lapsed
from messenger.consume.levels import LevelPoller
from messenger.consume.lifecycle import ConsumerState, one_received_line
from messenger.consume.mailbox import (
    DeleteBatcher,
    Delivery,
    EntryError,
    Mailbox,
    Stage,
)
from messenger.consume.outcome import Outcome, OutcomePolicy
from messenger.consume.prefetch import Prefetch
from messenger.consume.watchdog import ProcessingTimeout, Watchdog
from messenger.jobs.controls import CancelRequests, PauseMark
from messenger.offload import PayloadStore

logger = logging.getLogger(__name__)

#: How long the receiver waits for one more worker to free up before polling for fewer messages,
#: and at most in all.
COALESCE_SECONDS = 0.02
MAX_COALESCE_SECONDS = 0.25
RECEIVE_BACKOFF_SECONDS = 2.0
#: A poll's messages run on the receiver's thread when, at the typical time spent on a chain (a
#: message; a group's messages on an ordered channel), they take at most this long; else a
#: worker is woken for each chain. 2 ms: a fast message costs ~75 µs of CPU here, but its wall
#: time, which a loaded machine (other processes, this one's deleter holding the GIL) stretches
#: to 100-200 µs; at 1 ms, 7-19% of a drain's polls woke all ten workers.
HANDOFF_SECONDS = 0.002
#: The typical time of a chain is the median of the last CHAIN_WINDOW chains' wall times: a
#: chain that waited 5 ms for the GIL (the deleter's batch) or for a core does not move it, where
#: it pushed a running average over HANDOFF_SECONDS for the next few polls (16% of a drain's
#: polls woke all ten workers at load average 6); half of them slow does.
CHAIN_WINDOW = 16
#: A receiver running a poll's messages this long (checked at each watchdog tick) is replaced.
RESCUE_SECONDS = 0.05
#: Weight of the newest chain in that running average.
CHAIN_TIME_WEIGHT = 0.2
#: The last calls of a shutdown (releases, pending deletes) get at least this long, even when
#: in-flight handlers used up the shutdown timeout.
WIND_DOWN_SECONDS = 1.0


class Runtime:
    """Runs one consumer against its mailbox until `stop()` or a fatal error."""

    def __init__(
        self, consumer: RuntimeHost, mailbox: Mailbox, store: PayloadStore,
        poller: LevelPoller | None = None, lease_sqs: Any | None = None,
        control_sqs: Any | None = None, cancels: CancelRequests | None = None,
    ) -> None:
        """lease_sqs: the SQS client renewals use (their own connections and a short read
        timeout; default: the mailboxes' clients). control_sqs: the client that reads the pause
        tag, and cancels: the channel's cancel requests (`messenger.consume.controls`; None:
        no control watcher)."""
        self.consumer = consumer
        self.config = consumer.runtime
        self.mailbox = mailbox
        #: Chooses the level of each poll on a prioritized channel (None: poll `mailbox`).
        self.poller = poller
        self.store = store
        self.visibility = consumer.visibility_timeout
        self.stopping = threading.Event()
        self.fatal: BaseException | None = None
        #: `_cond`'s lock: the hot paths take it directly (a Condition's `with` is Python code).
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._held: dict[str, Delivery] = {}  # receipt handle → delivery, until finished
        #: Completed messages whose delete SQS has not confirmed yet (Stage.DELETING): leased,
        #: but no longer holding a worker.
        self._deleting: dict[str, Delivery] = {}
        self._stuck: dict[int, float] = {}  # handler threads past their timeout → since
        self._last_poll_empty = False
        #: What the last poll brought, for the pending deletes once nothing is held
        #: (`DeleteBatcher.went_idle`): nothing (the queue ran dry: they go out at once); some,
        #: fewer than it asked for (a trickle: they wait up to TRICKLE_DELETE_SECONDS for the
        #: next messages' deletes to join them); a full poll (a backlog: IDLE_DELETE_SECONDS).
        self._last_poll_dry = False
        self._last_poll_trickle = False
        self._progress = 0
        self._work = WorkQueue()
        #: The thread that polls; another one after a rescue (`rescue_receiver`).
        self._receiver: threading.Thread | None = None
        #: Receives in flight beside the receiver's (`_receive_beside`): key → (when sent,
        #: messages asked for). Empty unless prefetching on a backlog.
        self._in_flight: dict[int, tuple[float, int]] = {}
        self._receive_keys = itertools.count()
        #: When the receiver began running a poll's messages itself (None: it is not).
        self._inline_since: float | None = None
        #: Recent average wall time a worker spends on a chain (None before the first).
        self._chain_seconds: float | None = None
        #: The wall times of the last chains (`typical_chain_seconds`).
        self._recent_chains: deque[float] = deque(maxlen=CHAIN_WINDOW)
        #: Fetching ahead for workers about to free up (off on ordered channels).
        self.prefetch = Prefetch(0.0 if consumer.ordered else self.config.prefetch_wait)
        self.deleter = DeleteBatcher(mailbox, self.config.delete_linger, self._delete_failed,
                                     self._deleted, idle=self._holds_nothing)
        self._threads: list[threading.Thread] = []
        self.leases = LeaseKeeper(self, lease_sqs)
        self.watchdog = Watchdog(self)
        #: Who paused the channel (None: not paused): the receiver does not poll meanwhile.
        self.paused: PauseMark | None = None
        self.controls = (ControlWatcher(self, control_sqs, cancels)
                         if control_sqs is not None else None)
        #: What happens to each message (shared with the Lambda runtime); a dead letter it
        #: cannot forward for want of a DLQ stops the consumer (`decision.on_forward_failed`).
        self.outcomes = OutcomePolicy(consumer, store, done_stage=Stage.DELETING,
                                      stop=self.fail)

    # -- state ------------------------------------------------------------------------------
    def free_slots(self) -> int:
        return self.config.concurrency - len(self._held) - len(self._stuck)

    def _holds_nothing(self) -> bool:
        """No message received and not finished (a stuck handler's counts as held)."""
        return not self._held and not self._stuck

    def current_state(self) -> ConsumerState:
        with self._lock:
            if self.stopping.is_set():
                return ConsumerState.EXITING
            if self._held or self._stuck:
                return ConsumerState.PROCESSING
            if self.paused is not None:
                return ConsumerState.PAUSED
            return ConsumerState.IDLE if self._last_poll_empty else ConsumerState.LISTENING

    def held(self, *stages: Stage) -> list[Delivery]:
        """The messages held now, in the given stages (Stage.DELETING: waiting for their
        delete)."""
        with self._cond:
            found = [d for d in self._held.values() if d.stage in stages]
            if Stage.DELETING in stages:
                found += [d for d in self._deleting.values() if d.stage is Stage.DELETING]
            return found

    def mark_stuck(self, thread_id: int, since: float) -> None:
        """A handler thread timed out: its worker counts as lost until the thread returns."""
        with self._cond:
            self._stuck[thread_id] = since

    def stuck_since(self) -> list[float]:
        with self._cond:
            return list(self._stuck.values())

    @property
    def progress(self) -> int:
        """Messages finished so far (completed, failed, dead-lettered on purpose)."""
        with self._cond:
            return self._progress

    def refresh_state(self) -> None:
        # Decide and enter under one lock, so that concurrent refreshes cannot enter stale states.
        with self.consumer.transition_lock:
            self.consumer.transition(self.current_state())

    def set_paused(self, mark: PauseMark | None) -> None:
        """Pause (a mark: stop polling once the receives in flight answer) or resume (None)."""
        with self._cond:
            was, self.paused = self.paused, mark
            self._cond.notify_all()
        if mark is not None:
            self.consumer.emit("paused", fields={"by": mark.by, "at": mark.at})
        elif was is not None:
            self.consumer.emit("resumed", fields={"paused_by": was.by})
        self.refresh_state()

    def cancel(self, delivery: Delivery, by: str) -> bool:
        """Stop a running message at the watchdog's next tick, as a processing timeout
        ('cancelled by <who>'); False when it no longer runs."""
        if not stop_now(delivery, by):
            return False
        # (The watchdog's next tick, within TICK_SECONDS, finds it past its deadline.)
        self.consumer.emit("cancel_requested", delivery.log_id, fields={"by": by})
        return True

    def fail(self, error: BaseException) -> None:
        """A fatal error: stop, and make `run` raise it after the graceful shutdown."""
        if self.fatal is None:
            self.fatal = error
        self.consumer.emit("fatal", fields={"error": f"{type(error).__name__}: {error}"})
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        with self._cond:
            self._cond.notify_all()

    # -- main -------------------------------------------------------------------------------
    def start(self) -> None:
        # The lease keeper first: nothing started after it can hold a message it does not renew.
        targets = [("leases", self.leases.run), ("receiver", self._receive_loop),
                   ("watchdog", self.watchdog.run)]
        if self.controls is not None:
            targets.append(("controls", self.controls.run))
        self.deleter.start(self._guarded)
        targets += [(f"worker-{n}", self._worker_loop) for n in range(self.config.concurrency)]
        for name, target in targets:
            thread = threading.Thread(target=self._guarded(target), name=f"messenger-{name}",
                                      daemon=True)
            if name == "receiver":
                self._receiver = thread
            thread.start()
            self._threads.append(thread)

    def _guarded(self, target: Callable[[], None]) -> Callable[[], None]:
        """A runtime thread that dies of an unexpected error (a bug here) stops the consumer
        with that error (its traceback logged, a `fatal` event, then `run` raises it: the
        process exits 1 and ECS replaces the task) instead of leaving it alive without that
        thread. Messages it held are released at shutdown."""
        def run() -> None:
            try:
                target()
            except BaseException as error:
                logger.exception("runtime thread %s died", threading.current_thread().name)
                self.fail(error)

        return run

    def wait(self) -> None:
        """Block until stopping (signal, fatal error); then shut down gracefully."""
        while not self.stopping.wait(0.5):
            pass
        self.shutdown()

    def shutdown(self) -> None:
        """No new message starts; in-flight work finishes up to the shutdown timeout; what is
        left is released; pending deletes go out. The whole takes at most the shutdown timeout
        (at least WIND_DOWN_SECONDS for the last calls): against an endpoint that does not
        answer, the last calls are left behind (`shutdown_incomplete`; their messages come
        back when their leases end) rather than outliving ECS's stop timeout."""
        self.stop()
        self.refresh_state()
        deadline = time.monotonic() + self.config.shutdown_timeout
        # Messages waiting for a worker go back at once, not once a busy worker frees up.
        waiting = [d for chain in self._work.drain() for d in chain
                   if d.claim(Stage.QUEUED, Stage.DONE)]
        if waiting:
            threading.Thread(
                target=self._guarded(lambda: self._release(waiting, reason="shutdown")),
                name="messenger-release", daemon=True).start()
        with self._cond:
            # Held: queued, running, or being dead-lettered by the watchdog.
            while self._held and time.monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            left = [d for d in self._held.values() if d.stage in (Stage.QUEUED, Stage.RUNNING)]
        # Claim from the stage seen: a handler that finished meanwhile keeps its delete.
        abandoned = [d for d in left
                     if d.claim(Stage.QUEUED, Stage.DONE) or d.claim(Stage.RUNNING, Stage.DONE)]
        finish = threading.Thread(target=self._guarded(lambda: self._wind_down(abandoned)),
                                  name="messenger-shutdown", daemon=True)
        finish.start()
        finish.join(max(WIND_DOWN_SECONDS, deadline - time.monotonic()))
        if finish.is_alive():
            self.consumer.emit("shutdown_incomplete", fields={
                "unconfirmed_deletes": len(self._deleting), "abandoned": len(abandoned),
                "shutdown_timeout": self.config.shutdown_timeout,
            })

    def _wind_down(self, abandoned: list[Delivery]) -> None:
        """Release what was not finished, send the pending deletes, stop the threads (leases
        last: a message stays leased until its delete went out)."""
        if abandoned:
            self._release(abandoned, reason="shutdown_timeout")
        self._work.close()
        self.deleter.close()
        self.watchdog.stop()
        if self.controls is not None:
            self.controls.stop()
        self.leases.stop()
        self.watchdog.report_lease_events()

    # -- receiving --------------------------------------------------------------------------
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
            wait = 0 if type(self).poll is Runtime.poll else None
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

    def _dispatch(self, deliveries: list[Delivery], inline: bool = True) -> None:
        """Hold a poll's messages and queue them for the workers; with `inline`, run them on
        this (the receiver's) thread when they are fast (`workers_to_wake`, `_run_here`)."""
        with self._lock:
            for delivery in deliveries:
                self._held[delivery.receipt_handle] = delivery
            self._last_poll_empty = not deliveries
        with one_received_line():  # one log line per poll; on_event gets every message's
            for delivery in deliveries:
                fields: dict[str, Any] = {
                    "receive_count": delivery.receive_count, "group_id": delivery.group_id,
                }
                if delivery.level is not None:
                    fields["priority"] = delivery.level
                self.consumer.emit("received", delivery.log_id, fields=fields)
        self.refresh_state()
        chains = self._chains(deliveries)
        wake = workers_to_wake(typical_chain_seconds(self._recent_chains), len(chains)) \
            if inline else len(chains)
        self._work.put(chains, wake=wake)
        if chains and not wake:
            self._run_here()

    def _run_here(self) -> None:
        """Run the queued chains on the receiver's thread, until none is left or the watchdog
        has replaced this receiver (`rescue_receiver`: the workers take the rest).

        CPU optimisation: the plain path is the workers taking the chains `_dispatch` queued
        (woken one per chain); this saves those wakes for polls of fast messages."""
        me = threading.current_thread()
        with self._lock:
            self._inline_since = time.monotonic()
        with self.deleter.deferred_wakes():  # the deleter is woken once per batch
            while self._receiver is me:
                chain = self._work.take(block=False)
                if chain is None:
                    break
                self._run_taken(chain)
        with self._lock:
            if self._receiver is me:
                self._inline_since = None

    def rescue_receiver(self, now: float) -> bool:
        """Replace a receiver that has been running a poll's messages for RESCUE_SECONDS or
        more (a handler slower than the recent ones): idle workers take the rest of its poll, a
        new receiver thread polls. The watchdog calls this every tick; True when replaced.
        Part of the CPU optimisation of `_run_here` (a plain receiver never runs handlers)."""
        with self._cond:
            since = self._inline_since
            if since is None or now - since < RESCUE_SECONDS or self.stopping.is_set():
                return False
            self._inline_since = None
            thread = threading.Thread(target=self._guarded(self._receive_loop),
                                      name="messenger-receiver", daemon=True)
            self._receiver = thread
            self._threads.append(thread)
        self._work.wake_waiting()
        thread.start()
        return True

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

    # -- processing -------------------------------------------------------------------------
    def _worker_loop(self) -> None:
        while (chain := self._work.take()) is not None:
            self._run_taken(chain)

    def _run_taken(self, chain: list[Delivery]) -> None:
        """Run a chain taken from the work queue (on a worker's or the receiver's thread)."""
        began = time.monotonic()
        try:
            self._run_chain(chain)
            took = time.monotonic() - began
            self._recent_chains.append(took)
            average = self._chain_seconds  # workers race here: a lost update only skews it
            self._chain_seconds = took if average is None else \
                average + CHAIN_TIME_WEIGHT * (took - average)
        except ProcessingTimeout:
            pass  # a late interruption of a handler already timed out and dead-lettered
        finally:
            # The watchdog marks a thread stuck while it runs a handler (under the message's
            # lock, which the handler's thread takes on its way out): no lock needed to see it.
            if self._stuck:
                with self._cond:
                    returned = self._stuck.pop(threading.get_ident(), None) is not None
                    if returned:  # a timed-out handler's thread is a worker again
                        self._cond.notify_all()
                if returned:
                    self.refresh_state()

    def _run_chain(self, chain: list[Delivery]) -> None:
        for position, delivery in enumerate(chain):
            if self.stopping.is_set():
                self._release([d for d in chain[position:] if d.claim(Stage.QUEUED, Stage.DONE)],
                              reason="shutdown")
                return
            ok = self._process(delivery)
            then = decision.after_step(self.consumer.ordered, ok, len(chain) - position - 1)
            if then.action is Action.RELEASE_REST:  # the group's order: the rest waits
                rest = [d for d in chain[position + 1:] if d.claim(Stage.QUEUED, Stage.DONE)]
                self._release(rest, reason=then.reason)
                return

    def _process(self, delivery: Delivery) -> bool:
        """Run one message (`OutcomePolicy.run`); True when it is finished for good (deleted or
        dead-lettered)."""
        with delivery.lock:
            if delivery.stage is not Stage.QUEUED:
                return False
            delivery.stage = Stage.RUNNING
            delivery.started_at = time.monotonic()
            delivery.deadline = decision.deadline(delivery.started_at,
                                                  self.consumer.processing_timeout)
            delivery.thread_id = threading.get_ident()
        verdict = self.outcomes.run(delivery, self.mailbox.budget)
        self._check_lease(delivery)
        if verdict is Outcome.TIMED_OUT:  # returned past its deadline before the tick saw it
            self.watchdog.timed_out(delivery)
            return False
        if verdict is Outcome.TAKEN:  # timed out meanwhile: the watchdog dead-letters it
            return False
        if verdict.deletes:
            with self._lock:
                self._deleting[delivery.receipt_handle] = delivery
            self.deleter.add(delivery)
        self._finish(delivery, progress=verdict is not Outcome.KEPT)
        return verdict.finished

    def _check_lease(self, delivery: Delivery) -> None:
        """Report a lease that ran out while the message ran (the process stalled, e.g. a C call
        held the GIL): SQS may have handed the message to another consumer meanwhile."""
        now = time.monotonic()
        # The lease keeper only ever moves lease_until forward: a lease still running needs
        # no lock to tell.
        if delivery.lease_until <= now and lease_lapsed(delivery, now):
            name, message_id, fields = lapse_event(delivery, now, self.visibility)
            self.consumer.emit(name, message_id, fields=fields)

    def report_timeout(self, delivery: Delivery) -> None:
        """The watchdog marked the message timed out: its 'timed_out' event."""
        self.outcomes.report_timeout(delivery)

    def forward_timed_out(self, delivery: Delivery) -> None:
        """Forward a timed-out message to the DLQ (on the watchdog's forwarder thread)."""
        self.outcomes.forward_timed_out(delivery)
        self._finish(delivery)

    def _finish(self, delivery: Delivery, progress: bool = False) -> None:
        with self._lock:
            self._held.pop(delivery.receipt_handle, None)
            if progress:
                self._progress += 1
            # Wake the receiver (and a shutdown) only when that lets it move on: a first free
            # worker, a full poll's worth, nothing held. Its waits are short and it counts free
            # workers itself, so it need not wake for each message a busy worker finishes.
            free = self.free_slots()
            idle = not self._held and not self._stuck
            if free == 1 or free >= min(10, self.config.concurrency) or idle or \
                    self.stopping.is_set():
                self._cond.notify_all()
        if idle:  # no other message to batch the pending deletes with until the next poll's
            self.deleter.went_idle(self._last_poll_dry, self._last_poll_trickle)
        if idle or self.stopping.is_set():  # else the state stays PROCESSING
            self.refresh_state()

    def _release(self, deliveries: Sequence[Delivery], reason: str) -> None:
        if not deliveries:
            return
        try:
            errors = self.mailbox.release(deliveries)
        except Exception as error:
            errors = [EntryError(d, type(error).__name__, str(error)) for d in deliveries]
        failed = {id(e.delivery) for e in errors}
        for delivery in deliveries:
            self.consumer.emit(
                "released", delivery.log_id,
                fields={"reason": reason, "ok": id(delivery) not in failed},
            )
        with self._cond:
            for delivery in deliveries:
                self._held.pop(delivery.receipt_handle, None)
            self._cond.notify_all()
        self.refresh_state()

    def _delete_failed(self, failed: EntryError) -> bool:
        """A delete SQS refused or that failed: True to try it again (a transient failure; the
        lease keeper keeps the message leased meanwhile), False to give it up (SQS refused it
        for good: the receipt handle is no longer valid, the message may come back)."""
        delivery = failed.delivery
        retry = failed.transient
        self.consumer.emit(
            "delete_failed", delivery.log_id,
            fields={"code": failed.code, "error": failed.message, "retry": retry},
        )
        if not retry:
            self._deleted([delivery])
        return retry

    def _deleted(self, deliveries: Sequence[Delivery]) -> None:
        """Deletes SQS confirmed (or gave up): the messages are no longer leased."""
        with self._lock:
            for delivery in deliveries:
                delivery.stage = Stage.DONE
                self._deleting.pop(delivery.receipt_handle, None)


def typical_chain_seconds(recent: Sequence[float]) -> float | None:
    """The median of the recent chains' wall times (the upper one of an even count); None
    before the first chain."""
    if not recent:
        return None
    ordered = sorted(recent)
    return ordered[len(ordered) // 2]


def workers_to_wake(chain_seconds: float | None, chains: int) -> int:
    """How many idle workers a poll of `chains` chains wakes: none when they would take at most
    HANDOFF_SECONDS at `chain_seconds` each (`typical_chain_seconds`; None: not known yet), since
    the receiver runs them itself (a CPU optimisation); else one per chain (the plain path)."""
    if chain_seconds is not None and chain_seconds * chains <= HANDOFF_SECONDS:
        return 0
    return chains


class WorkQueue:
    """Chains of received messages waiting for a worker.

    `put` wakes idle workers (one per chain, or none when the receiver runs them itself); a
    worker that finishes a chain takes the next one without waiting. `overdue` takes out the
    chains that waited too long while no worker was idle (`prefetch_wait`), `drain` all of them
    (shutdown)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # idle workers wait here
        self._chains: deque[list[Delivery]] = deque()
        self._closed = False
        self._idle = 0  # workers waiting in `take`

    def put(self, chains: list[list[Delivery]], wake: int = 1) -> None:
        """Queue the chains and wake up to `wake` idle workers."""
        if not chains:
            return
        with self._lock:
            self._chains.extend(chains)
            if wake:
                self._ready.notify(wake)

    def wake_waiting(self) -> None:
        """Wake an idle worker for each chain waiting."""
        with self._ready:
            self._ready.notify(len(self._chains))

    def take(self, block: bool = True) -> list[Delivery] | None:
        """The next chain; None once closed and empty (the worker exits), or when empty and
        not `block`."""
        with self._lock:
            while not self._chains:
                if self._closed or not block:
                    return None
                self._idle += 1
                try:
                    self._ready.wait()
                finally:
                    self._idle -= 1
            return self._chains.popleft()

    def overdue(self, cutoff: float) -> tuple[list[list[Delivery]], float | None]:
        """Take out the chains received at `cutoff` or before; and when the oldest chain left
        was received (None: none waits, or a worker is idle). While a worker is idle (woken, or
        left for the receiver to run them) no chain waits behind busy workers: none is taken."""
        with self._lock:
            chains = self._chains
            if self._idle:
                return [], None
            taken: list[list[Delivery]] = []
            while chains and chains[0][0].received_at <= cutoff:
                taken.append(chains.popleft())
            return taken, chains[0][0].received_at if chains else None

    def drain(self) -> list[list[Delivery]]:
        """Take out every chain waiting."""
        with self._lock:
            taken = list(self._chains)
            self._chains.clear()
            return taken

    def close(self) -> None:
        """Wake every worker: each exits once the queue is empty."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
