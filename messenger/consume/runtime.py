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
- The parts, one file each: `Runtime` here (state, threads, the hand-off of a poll's messages),
  `messenger.consume.receiving` (the receiver), `messenger.consume.workers` (workers),
  `messenger.consume.work_queue` (chains waiting for a worker), `messenger.consume.shutdown`
  (graceful shutdown), `messenger.consume.parts` (what they share); the lease keeper, watchdog
  and control watcher have modules of their own.
- The watchdog (`messenger.consume.watchdog`) times out handlers; the delete batcher sends
  deletes on its own thread.
- The control watcher (`messenger.consume.controls`) reads an operator's pause and cancel
  requests once per heartbeat interval: paused, the receiver stops polling (what is held
  finishes; the state is PAUSED once nothing is); a cancelled running message's deadline is
  moved to now, and the watchdog stops it as a processing timeout, 'cancelled by <who>'.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from messenger.consume.controls import ControlWatcher, stop_now
from messenger.consume.host import RuntimeHost
from messenger.consume.lease import LeaseKeeper
from messenger.consume.levels import LevelPoller
from messenger.consume.lifecycle import ConsumerState, one_received_line
from messenger.consume.mailbox import DeleteBatcher, Delivery, Mailbox, Stage
from messenger.consume.outcome import OutcomePolicy
from messenger.consume.prefetch import Prefetch
from messenger.consume.receiving import (
    COALESCE_SECONDS,
    MAX_COALESCE_SECONDS,
    RECEIVE_BACKOFF_SECONDS,
    Receiving,
)
from messenger.consume.shutdown import WIND_DOWN_SECONDS, ShuttingDown
from messenger.consume.watchdog import ProcessingTimeout, Watchdog
from messenger.consume.work_queue import WorkQueue
from messenger.consume.workers import CHAIN_TIME_WEIGHT, Working
from messenger.jobs.controls import CancelRequests, PauseMark
from messenger.offload import PayloadStore

logger = logging.getLogger(__name__)

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

__all__ = [
    "CHAIN_TIME_WEIGHT", "CHAIN_WINDOW", "COALESCE_SECONDS", "HANDOFF_SECONDS",
    "MAX_COALESCE_SECONDS", "RECEIVE_BACKOFF_SECONDS", "RESCUE_SECONDS", "WIND_DOWN_SECONDS",
    "ProcessingTimeout", "Runtime", "WorkQueue", "typical_chain_seconds", "workers_to_wake",
]


class Runtime(Receiving, Working, ShuttingDown):
    """Runs one consumer against its mailbox until `stop()` or a fatal error (its parts:
    `Receiving`, `Working`, `ShuttingDown`)."""

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

    # -- handing a poll's messages over --------------------------------------------------
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
