"""Bounded prefetch: how many messages the receiver asks for, and when.

Fetching only for workers that are free now makes every worker wait a receive round trip
between two messages: with 50 ms handlers that is a third of the time. So the receiver also
fetches for the workers it expects to free up by the time the messages arrive, from this
consumer's own measures: the recent round trip of its receives (the lead: their average plus
twice their deviation), and the recent time a worker spends on a message. It asks at the last
moment that still gets the messages there in time (a lead before the first worker it fetches
for is expected to free up), and for every worker expected to free up within the lead plus
SLACK_SECONDS from then (fuller polls: a receive costs the same for 1 message as for 10).

One receive brings at most 10 messages a round trip: when the workers get through more than
that (10 workers of 10 ms against a 20 ms round trip want 20 messages per round trip), up to
MAX_RECEIVES_IN_FLIGHT receives are in flight at once, but only while prefetch is on and the
polls come back full (a backlog). A receive in flight counts, in the plan, as the messages it
asked for arriving a round trip after it was sent (a late one: arriving now, and the next
receive is not put off for it): the next one asks only for the workers expected to be out of
work within the same horizon once those have run. A poll that came back short, or one in
flight for over OUTLIER round trips (the queue running dry: it waits for messages, and more
receives would be empty long polls), leaves one receive in flight at a time, as does prefetch
off or paused.

The rule that keeps this from hiding messages behind a busy pool while another consumer could
take them:
- a message is fetched only for a worker expected to be out of work within the lead plus
  SLACK_SECONDS (at most half of `prefetch_wait`), counting the messages already waiting (each
  goes to the worker expected to be out of work first); a worker whose message has run twice
  the recent average (and at least LATE_SECONDS more than expected) says nothing about when it
  ends and is not counted (a pool busy with long handlers, or with a handler much slower than
  the recent ones, fetches nothing for it);
- no received message waits for a worker longer than `prefetch_wait` (0.5 s by default): past
  that it is released, visible again at once, by the watchdog (its lease is renewed by the lease
  keeper meanwhile, like any held message), and prefetching pauses for PAUSE_SECONDS, since this
  consumer's predictions were off; at shutdown the waiting messages are released at once.

Prefetch is off, and the receiver fetches only for free workers (coalescing them into fuller
polls), before both measures exist, for messages that take under MIN_BUSY_SECONDS on average
(handlers that do not wait), on ordered channels (a group stays locked until its message
is deleted: fetching ahead would only find other groups, or wait out a long poll), and when
`prefetch_wait` is 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

#: How much further than a round trip the receiver looks for workers to fetch for: messages for
#: workers out of work up to this long after the poll answers join the poll (fuller polls, and
#: workers that start together, not quite at once, are served by one poll).
SLACK_SECONDS = 0.05
#: Weight of the newest round trip in the running averages.
ROUND_TRIP_WEIGHT = 0.2
#: Deviations of the round trip added to it for the lead (a slow receive still in time).
DEVIATIONS = 2.0
#: A receive this many times slower than the average counts as this many (it waited for its
#: messages rather than for the endpoint).
OUTLIER = 4.0
#: Messages taking less than this on average (handlers that do not wait) are fetched for free
#: workers only: there a poll and the handlers compete for the same CPU (the GIL), and a worker
#: does not wait a round trip long enough to matter (`runtime.HANDOFF_SECONDS`'s fast path).
MIN_BUSY_SECONDS = 0.001
#: A running message late by less than this (or than the average time per message) is still
#: expected any moment (the receiver itself may wake late on a busy machine).
LATE_SECONDS = 1.0
#: Seconds prefetching stays off after a message waited past `prefetch_wait`.
PAUSE_SECONDS = 10.0
#: The most receives in flight at once while prefetching on a backlog (3: 30 messages per round
#: trip, 1,500 msg/s at a 20 ms round trip).
MAX_RECEIVES_IN_FLIGHT = 3


@dataclass(frozen=True)
class FetchPlan:
    """What the receiver does now: ask for `count` messages (> 0), or wait `wait` seconds
    (None: until a worker frees up) and plan again."""

    count: int
    wait: float | None = None


class Prefetch:
    """One consumer's measures and its prefetch decisions.

    limit: `prefetch_wait`, the longest a message may wait for a worker (0: prefetch off).
    """

    def __init__(self, limit: float) -> None:
        self.limit = limit
        #: Recent average seconds of a receive answered in full (None before the first), and
        #: the recent average of how far one is from that.
        self.round_trip: float | None = None
        self.deviation = 0.0
        #: The receive answered last came back with every message it asked for (a backlog).
        self.last_full = False
        self._paused_until = 0.0

    def observe_poll(self, seconds: float, asked: int, got: int) -> None:
        """Time a receive. Only a poll answered in full counts: one that got fewer messages
        than it asked for may have waited for them (a long poll on a short queue). One that
        asked for few may have waited all the same: a time over OUTLIER times the average
        counts as that much."""
        self.last_full = 0 < asked <= got
        if not self.last_full:
            return
        average = self.round_trip
        if average is None:
            self.round_trip, self.deviation = seconds, seconds / 2
            return
        seconds = min(seconds, OUTLIER * average)
        self.round_trip = average + ROUND_TRIP_WEIGHT * (seconds - average)
        self.deviation += ROUND_TRIP_WEIGHT * (abs(seconds - average) - self.deviation)

    def lead(self) -> float:
        """How long before a worker frees up to ask for its message: the recent round trip,
        plus twice its recent deviation (as TCP times its retransmissions), at most half the
        limit (a message fetched that early and answered at once still has half the limit
        left for the worker being late)."""
        return min(self.limit / 2, (self.round_trip or 0.0) + DEVIATIONS * self.deviation)

    def pause(self, now: float) -> None:
        """A message waited past the limit: fetch only for free workers for PAUSE_SECONDS."""
        self._paused_until = now + PAUSE_SECONDS

    def active(self, now: float, busy_seconds: float | None) -> bool:
        """Whether to fetch ahead: both measures exist and prefetch is neither off nor paused.
        busy_seconds: the recent average time a worker spends on a message (None: unknown)."""
        return (self.limit > 0 and self.round_trip is not None and busy_seconds is not None
                and busy_seconds >= MIN_BUSY_SECONDS and now >= self._paused_until)

    def plan(self, now: float, workers: int, started: Sequence[float], waiting: int,
             busy_seconds: float, wanted: int,
             in_flight: Sequence[tuple[float, int]] = ()) -> FetchPlan:
        """How many messages to ask for now (only when `active`).

        workers: the workers (concurrency, less the threads lost to a timed-out handler).
        started: when each running message started. waiting: messages received and not
        started. busy_seconds: the recent average time per message. wanted: the most one poll
        asks for (min(10, concurrency)). in_flight: the receives sent and not answered yet,
        as (when sent, messages asked for); with any, nothing more is asked for once there are
        MAX_RECEIVES_IN_FLIGHT, when the last poll came back short, or when one has been in
        flight over OUTLIER round trips (a long poll waiting for messages: the queue has run
        dry) (wait: None, until one is answered)."""
        round_trip = self.round_trip or 0.0
        if in_flight and (len(in_flight) >= MAX_RECEIVES_IN_FLIGHT or not self.last_full
                          or any(now - sent > OUTLIER * round_trip for sent, _ in in_flight)):
            return FetchPlan(0, None)
        lead = self.lead()  # a poll asked now answers about this much later, at most
        horizon = min(self.limit / 2, lead + SLACK_SECONDS)
        arriving = sorted(max(now, sent + round_trip)
                          for sent, asked in in_flight for _ in range(asked))
        free_at = self.free_times(now, workers, started, waiting, busy_seconds, horizon,
                                  arriving)
        count = min(wanted, sum(1 for at in free_at if at <= now + horizon))
        # A receive later than a round trip (not yet OUTLIER times) counts as answering now,
        # whenever now is: the time its messages keep the workers busy moves on with the clock,
        # and a plan that waited for a lead before that would wait as long as it is late.
        overdue = any(sent + round_trip <= now for sent, _ in in_flight)
        if count > 0 and (free_at[0] - lead <= now or overdue):
            # A worker is out of work, or will be by the time a poll answers: ask now for every
            # worker out of work by then plus the slack.
            return FetchPlan(count)
        return FetchPlan(0, free_at[0] - lead - now if free_at else None)

    @staticmethod
    def free_times(now: float, workers: int, started: Sequence[float], waiting: int,
                   busy_seconds: float, horizon: float,
                   arriving: Sequence[float] = ()) -> list[float]:
        """When each worker is expected to be out of work, soonest first, once the waiting
        messages, then those `arriving` (when each is expected: the receives in flight), have
        run, each on the worker out of work first. A worker whose message is late by more than
        the recent average and more than LATE_SECONDS says nothing about when it ends: it is
        left out, and so is a waiting message no such worker is expected to take."""
        late = now - max(horizon, busy_seconds, LATE_SECONDS)
        free_at = [now] * max(0, workers - len(started))
        free_at += [began + busy_seconds for began in started if began + busy_seconds >= late]
        heapq.heapify(free_at)
        for ready in ([now] * waiting + list(arriving)) if free_at else ():
            heapq.heapreplace(free_at, max(ready, free_at[0]) + busy_seconds)
        return sorted(free_at)
