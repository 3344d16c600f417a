"""The consumer's limit gate (`LimitGate`): before a job's handler runs, the channel's rate
limit and its tenant's (`messenger.jobs.limits.RateLimiter`, global across every consumer
process of both runtimes) give it a start time; the gate waits for it, or says how long the job
is to be held back instead. The outcome policy (`messenger.consume.outcome`) asks it and
carries the verdict out (`decision.on_limited`): a short wait here, the job's lease kept, or
the job back in its queue as a new message with a delay, without using one of its attempts.

- The limits: the channel's declaration (its ChannelSpec, or the tags of its deployed queue),
  each one replaced by a run-time value set with `messenger limits set` (`LimitStore`), read
  again every REFRESH_SECONDS by the gate's thread: a change holds within 5 s.
- A job's weight (`Consumer.weight(message)`, default 1) is the units it takes of each limit.
  Its tenant: its MessageGroupId (a fair queue's tenant key, a FIFO group); a job without one
  has no tenant limit.
- `max_concurrency`, where the channel's consumers together could run more handlers
  (`MESSENGER_CONCURRENCY_CAP`, the CDK app's cap of all of them, is above the limit or not
  known): this process runs at most its share of a shared lease
  (`messenger.jobs.limits.ConcurrencyLease`), renewed every LEASE_SECONDS / 3; a job finds a
  free slot, waits a moment for one, or is held back like a rate-limited one. Under the cap the
  runtime's own bounds hold it (Lambda's MaximumConcurrency, tasks × workers) and no lease is
  taken.
- A handler's `messenger.RateLimited(retry_after)` pauses this process's jobs of the channel
  for `retry_after` (the upstream said slow down), besides holding that job back.
- The gate's thread (every TICK_SECONDS) refreshes the limits, reports this process's rate and
  waiting jobs to the store every REPORT_SECONDS (`LimitStore.report`: `messenger limits show`,
  the dashboard) and publishes the CloudWatch metrics (`METRIC_NAMESPACE`) every
  METRICS_SECONDS: jobs started, jobs limited, jobs waiting.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from messenger.consume import decision
from messenger.consume.decision import TENANT_WAIT_SECONDS, WAIT_IN_CONSUMER_SECONDS, Action
from messenger.jobs.limits import (
    LEASE_SECONDS,
    METRIC_DIMENSION,
    METRIC_LIMITED,
    METRIC_NAMESPACE,
    METRIC_STARTED,
    METRIC_WAITING,
    METRICS_SECONDS,
    REFRESH_SECONDS,
    REPORT_FRESH_SECONDS,
    STORE_BUDGET_SECONDS,
    UNIT_GRACE_SECONDS,
    ChannelLimits,
    ConcurrencyLease,
    LimiterUnavailable,
    LimitStore,
    RateLimiter,
    rate_key,
)

logger = logging.getLogger("messenger.consumer")

#: How often the gate's thread looks for what is due.
TICK_SECONDS = 0.5
#: Seconds between a process's reports to the store.
REPORT_SECONDS = 10.0
#: Tenants' limiters kept per process (the least recently used go first).
MAX_TENANTS = 10_000
#: The window of this process's recent rate (its report), seconds.
RATE_WINDOW_SECONDS = 10.0
#: Jobs held back lately, per limit, that the gate remembers (their spread: `_backlog`).
MAX_HELD_KEPT = 10_000
#: How long a held job counts in its limit's backlog (seconds).
HELD_WINDOW_SECONDS = 300.0
#: How often a job waiting for a concurrency slot looks again (seconds).
SLOT_POLL_SECONDS = 0.05
#: The CDK app's cap of all of a channel's consumers (`stacks.flow_control`): a whole number,
#: or unset / '' when one of them is unbounded.
CONCURRENCY_CAP_VARIABLE = "MESSENGER_CONCURRENCY_CAP"


def concurrency_cap(environ: Mapping[str, str] | None = None) -> int | None:
    """MESSENGER_CONCURRENCY_CAP: the most handlers the channel's consumers can run together
    (None: not known, or unbounded)."""
    value = (os.environ if environ is None else environ).get(CONCURRENCY_CAP_VARIABLE, "")
    return int(value) if value.strip().isdigit() else None


class LimitGate:
    """The limits of one consumer's channel, in one process (module doc).

    store: the limits table. channel: its name. declared: the channel's declaration.
    process: this process's id (its report). clock: epoch seconds. sleep: how the gate waits
    (a worker's thread). cloudwatch: a client for the metrics (None: none published).
    workers: handlers this process runs at once (the share of a concurrency lease it asks
    for). cap: the most handlers all the channel's consumers can run (None: not known)."""

    def __init__(self, store: LimitStore, channel: str, declared: ChannelLimits, process: str,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, cloudwatch: Any = None,
                 workers: int = 1, cap: int | None = None) -> None:
        self.store = store
        self.channel = channel
        self.declared = declared
        self.process = process
        self.clock = clock
        self.sleep = sleep
        self.cloudwatch = cloudwatch
        self.limits = declared
        self.workers = workers
        self.cap = cap
        self._lock = threading.Lock()
        self._channel: RateLimiter | None = None
        self._tenants: collections.OrderedDict[str, RateLimiter] = collections.OrderedDict()
        self._paused_until = 0.0
        self._refreshed_at: float | None = None
        self._reported_at = 0.0
        self._published_at = clock()
        self._processes = 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Counts: jobs started, jobs held back (waited or delayed), jobs waiting now (here).
        self.started = 0
        self.limited = 0
        self.waiting = 0
        self._delayed: collections.deque[float] = collections.deque()  # when jobs went back
        self._starts: collections.deque[float] = collections.deque()
        self._published = (0, 0)
        self._peak_waiting = 0
        #: The concurrency lease (None: max_concurrency needs none), and the jobs holding
        #: one of its slots (each: whether it still runs).
        self.lease: ConcurrencyLease | None = None
        self._slots: list[Callable[[], bool]] = []
        self._lease_limit: int | None = None
        #: Jobs held back lately by each limiter's key: job id → when.
        self._held: dict[str, collections.OrderedDict[str, float]] = {}
        self._apply(declared)

    # -- the limits ------------------------------------------------------------------------
    def _apply(self, limits: ChannelLimits) -> None:
        with self._lock:
            self.limits = limits
            if limits.rate_limit is None:
                self._channel = None
            elif self._channel is None:
                self._channel = RateLimiter(self.store, rate_key(self.channel),
                                            limits.rate_limit, clock=self.clock,
                                            most=self.workers)
            else:
                self._channel.rate = limits.rate_limit
            if limits.tenant_rate_limit is None:
                self._tenants.clear()
            else:
                for limiter in self._tenants.values():
                    limiter.rate = limits.tenant_rate_limit
            for limiter in self._limiters():
                limiter.processes = self._processes
            concurrency = limits.max_concurrency
            if concurrency is not None and (self.cap is None or self.cap > concurrency):
                if self.lease is None:
                    self.lease = ConcurrencyLease(self.store, self.channel, self.process,
                                                  clock=self.clock)
            elif self.lease is not None:
                lease, self.lease = self.lease, None
                lease.release()

    def runs_at_once(self, handlers: int) -> None:
        """How many jobs this process can start close together now (its workers; a Lambda
        invocation: its batch's records, run one after another): the channel limiter's largest
        batch (units no job takes before their time are lost)."""
        self.workers = max(1, handlers)
        with self._lock:
            if self._channel is not None:
                self._channel.most = self.workers

    def _limiters(self) -> list[RateLimiter]:
        found = list(self._tenants.values())
        if self._channel is not None:
            found.append(self._channel)
        return found

    def refresh(self) -> None:
        """Read the limits that hold now (the run-time values over the declaration); a store
        that fails keeps the last ones read."""
        self._refreshed_at = self.clock()
        try:
            limits = self.store.get(self.channel, self.declared, budget=STORE_BUDGET_SECONDS)
        except Exception as error:  # the last limits read stay
            logger.warning("limits of %s not readable: %s: %s", self.channel,
                           type(error).__name__, error)
            return
        if limits != self.limits:
            logger.info("limits of %s now %s", self.channel, limits.as_text())
        self._apply(limits)
        if self.lease is not None and limits.max_concurrency != self._lease_limit:
            self.renew()

    def renew(self) -> None:
        """Take or renew this process's share of the concurrency lease (a failure keeps the
        share until its end, then none: logged)."""
        lease, limit = self.lease, self.limits.max_concurrency
        if lease is None or limit is None:
            return
        try:
            lease.acquire(limit, self.workers)
            self._lease_limit = limit
        except LimiterUnavailable as error:
            logger.warning("concurrency lease of %s not renewed: %s", self.channel, error)

    def _tenant(self, tenant: str) -> RateLimiter | None:
        rate = self.limits.tenant_rate_limit
        if rate is None:
            return None
        with self._lock:
            limiter = self._tenants.get(tenant)
            if limiter is None:
                limiter = self._tenants[tenant] = RateLimiter(
                    self.store, rate_key(self.channel, tenant), rate, tenant=True,
                    clock=self.clock)
                limiter.processes = self._processes
                if len(self._tenants) > MAX_TENANTS:
                    self._tenants.popitem(last=False)
            else:
                self._tenants.move_to_end(tenant)
            return limiter

    # -- one job ---------------------------------------------------------------------------
    def admit(self, tenant: str | None, units: int = 1, room: float | None = None,
              ordered: bool = False, holds: int = 0,
              alive: Callable[[], bool] | None = None, job: str = "") -> int:
        """Wait until the job may start (its units of the channel's and its tenant's limits
        taken, the process's pause over): 0 when it may start now, else the whole seconds it
        is to be held back (`decision.on_limited`: the wait is longer than it may take here).
        room: seconds the job may wait here (Lambda: the invocation's time left; None: no
        bound). holds: times the job was held back before (its delay spreads out). alive:
        whether the job still runs (its concurrency slot is free once it says False). job: its
        id (a held job counts once in its limit's backlog, however often it comes back)."""
        limiters: list[RateLimiter] = []
        if tenant is not None:
            limiter = self._tenant(tenant)
            if limiter is not None:
                limiters.append(limiter)
        if self._channel is not None:
            limiters.append(self._channel)
        began = time.monotonic()
        self._note_waiting(1)
        try:
            if self.lease is not None:
                delay = self._take_slot(alive or (lambda: True), room, ordered, holds, began)
                if delay:
                    self.limited += 1
                    return delay
            delay = self._admit_rate(limiters, units, room, ordered, holds, began, job)
            if delay and alive is not None:
                self._free_slot(alive)
            return delay
        finally:
            self._note_waiting(-1)

    def _take_slot(self, alive: Callable[[], bool], room: float | None, ordered: bool,
                   holds: int, began: float) -> int:
        """A slot of this process's share of the concurrency lease: 0 once taken (after a
        wait here), else the hold's delay."""
        lease = self.lease
        while lease is not None:
            with self._lock:
                self._slots = [running for running in self._slots if running()]
                if len(self._slots) < lease.current():
                    self._slots.append(alive)
                    return 0
            waited = time.monotonic() - began
            left = None if room is None else room - waited
            verdict = decision.on_limited(waited + SLOT_POLL_SECONDS, left, ordered, holds)
            if verdict.action is Action.HOLD:
                self._delayed.append(self.clock())
                return max(1, verdict.delay)
            self.sleep(SLOT_POLL_SECONDS)
            lease = self.lease
        return 0

    def _free_slot(self, alive: Callable[[], bool]) -> None:
        with self._lock:
            if alive in self._slots:
                self._slots.remove(alive)

    def _admit_rate(self, limiters: list[RateLimiter], units: int, room: float | None,
                    ordered: bool, holds: int, began: float, job: str = "") -> int:
        """The pause, then the rate limiters' units (module doc): 0 when the job may start now
        (after the waits here), else the hold's delay."""
        counted = False
        while self._paused_until > self.clock():
            delay = self._wait_or_hold(self._paused_until, room, ordered, holds, began)
            counted = True
            if delay:
                return delay
        starts = []
        for limiter in limiters:
            while True:
                try:
                    at = limiter.take(units)
                except LimiterUnavailable as unavailable:
                    at, ready = None, unavailable.retry_at
                else:
                    ready = limiter.retry_at
                if at is not None:
                    starts.append(at)
                    now = self.clock()
                    if limiter is not limiters[-1] and at > now:
                        # The tenant's unit first: the channel's is then taken for now, never
                        # used later than its time (its window bound holds).
                        self.sleep(at - now)
                    break
                if not counted:
                    self.limited += 1
                    counted = True
                delay = self._wait_or_hold(ready, room, ordered, holds, began,
                                           most=TENANT_WAIT_SECONDS if limiter.tenant
                                           else WAIT_IN_CONSUMER_SECONDS,
                                           held=(limiter, job, units))
                if delay:
                    return delay
        start = max(starts, default=0.0)
        now = self.clock()
        if start > now:
            if not counted:
                self.limited += 1
            self.sleep(start - now)
            if self.clock() > start + UNIT_GRACE_SECONDS and limiters and not ordered:
                # Woke too late (a starved machine): the unit is past its grace; starting now
                # would crowd the next second. Hold the job back briefly instead.
                self._delayed.append(self.clock())
                return 1
        self._note_started()
        return 0

    def _wait_or_hold(self, ready: float, room: float | None, ordered: bool, holds: int,
                      began: float, most: float = WAIT_IN_CONSUMER_SECONDS,
                      held: tuple[RateLimiter, str, int] | None = None) -> int:
        """Wait here until `ready` (epoch s) when the decision allows it (0), else the hold's
        delay (seconds). held: the limiter, the job's id and units (its backlog)."""
        wait = max(0.0, ready - self.clock())
        left = None if room is None else room - (time.monotonic() - began)
        backlog = self._backlog(*held) if held is not None else 0.0
        verdict = decision.on_limited(wait, left, ordered, holds, most=most, backlog=backlog)
        if verdict.action is Action.HOLD:
            self._delayed.append(self.clock())
            if held is not None:
                self._note_held(held[0], held[1])
            return max(1, verdict.delay)
        self.sleep(wait)
        return 0

    def _backlog(self, limiter: RateLimiter, job: str, units: int) -> float:
        """Half the seconds `limiter` needs for the jobs held back on it lately (this
        process's, times the processes sharing it: SQS spreads a backlog over them), this one
        counted: they come back about twice as fast as the limit lets them run, so that one is
        at hand whenever a unit frees (a unit no job takes in time is lost)."""
        now = self.clock()
        with self._lock:
            held = self._held.get(limiter.key)
            if held is None:
                return units * limiter.interval
            while held and (len(held) > MAX_HELD_KEPT or
                            next(iter(held.values())) < now - HELD_WINDOW_SECONDS):
                held.popitem(last=False)
            known = len(held) + (0 if job and job in held else 1)
            return known * self._processes * units * limiter.interval / 2

    def _note_held(self, limiter: RateLimiter, job: str) -> None:
        now = self.clock()
        key = job or f"anonymous-{now}"
        with self._lock:
            held = self._held.setdefault(limiter.key, collections.OrderedDict())
            held[key] = now
            held.move_to_end(key)

    def rate_limited(self, retry_after: float) -> None:
        """A handler said the upstream is saturated (`messenger.RateLimited`): this process
        starts no job of the channel for `retry_after` seconds."""
        self.limited += 1
        self._paused_until = max(self._paused_until, self.clock() + retry_after)

    def _note_waiting(self, change: int) -> None:
        with self._lock:
            self.waiting += change
            self._peak_waiting = max(self._peak_waiting, self.waiting)

    def _note_started(self) -> None:
        now = self.clock()
        with self._lock:
            self.started += 1
            self._starts.append(now)

    def recent(self) -> tuple[float, int]:
        """This process's jobs started per second over the last RATE_WINDOW_SECONDS, and its
        jobs waiting on a limit: here, and held back in the queue within that window."""
        now = self.clock()
        with self._lock:
            while self._starts and self._starts[0] < now - RATE_WINDOW_SECONDS:
                self._starts.popleft()
            while self._delayed and self._delayed[0] < now - RATE_WINDOW_SECONDS:
                self._delayed.popleft()
            return len(self._starts) / RATE_WINDOW_SECONDS, self.waiting + len(self._delayed)

    # -- the gate's thread -----------------------------------------------------------------
    def start(self) -> None:
        """Read the limits, then refresh, report and publish on a thread of the gate's own."""
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="messenger-limits", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STORE_BUDGET_SECONDS + 1)
        if self.lease is not None:
            self.lease.release()
        self.publish()

    def _run(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            try:
                self.tick()
            except Exception:  # never a reason to stop consuming: logged, tried again
                logger.exception("limit gate of %s", self.channel)

    def tick(self) -> None:
        """What is due: the limits read again (REFRESH_SECONDS), the report (REPORT_SECONDS),
        the metrics (METRICS_SECONDS)."""
        now = self.clock()
        if self._refreshed_at is None or now - self._refreshed_at >= REFRESH_SECONDS:
            self.refresh()
        if self.lease is not None and now - self.lease.renewed_at >= LEASE_SECONDS / 3:
            self.renew()
        if now - self._reported_at >= REPORT_SECONDS:
            self.report()
        if now - self._published_at >= METRICS_SECONDS:
            self.publish()

    def report(self) -> None:
        """This process's report; reads the others' (the processes sharing the limiters)."""
        self._reported_at = now = self.clock()
        rate, waiting = self.recent()
        try:
            reports = self.store.reports(self.channel)
            stale = tuple(p for p, (_, _, at) in reports.items()
                          if now - at > 10 * REPORT_FRESH_SECONDS and p != self.process)
            self.store.report(self.channel, self.process, rate, waiting, stale)
        except Exception as error:
            logger.warning("report of %s not written: %s: %s", self.channel,
                           type(error).__name__, error)
            return
        fresh = sum(1 for p, (_, _, at) in reports.items()
                    if now - at <= REPORT_FRESH_SECONDS and p != self.process)
        self._processes = fresh + 1
        with self._lock:
            for limiter in self._limiters():
                limiter.processes = self._processes

    def publish(self) -> None:
        """The CloudWatch metrics since the last publish (one PutMetricData)."""
        self._published_at = self.clock()
        if self.cloudwatch is None:
            return
        with self._lock:
            started, limited = self.started, self.limited
            peak, self._peak_waiting = max(self._peak_waiting, self.waiting), self.waiting
        _, waiting = self.recent()
        before = self._published
        self._published = (started, limited)
        dimensions = [{"Name": METRIC_DIMENSION, "Value": self.channel}]
        try:
            self.cloudwatch.put_metric_data(Namespace=METRIC_NAMESPACE, MetricData=[
                {"MetricName": METRIC_STARTED, "Dimensions": dimensions,
                 "Value": float(started - before[0]), "Unit": "Count"},
                {"MetricName": METRIC_LIMITED, "Dimensions": dimensions,
                 "Value": float(limited - before[1]), "Unit": "Count"},
                {"MetricName": METRIC_WAITING, "Dimensions": dimensions,
                 "Value": float(max(peak, waiting)), "Unit": "Count"},
            ])
        except Exception as error:
            logger.warning("flow metrics of %s not published: %s: %s", self.channel,
                           type(error).__name__, error)

    @property
    def requests(self) -> int:
        """The limiters' and the lease's DynamoDB requests so far (the bench reads it)."""
        with self._lock:
            return sum(limiter.requests for limiter in self._limiters()) + \
                (self.lease.requests if self.lease is not None else 0)


__all__ = ["LimitGate", "concurrency_cap"]
