"""The flow-control store on the moto server (`messenger.jobs.limits`): run-time limits over a
channel's declaration, the consumers' reports, and the rate limiter's virtual time: its batches,
the one-second windows, its requests per job, and the store unavailable. Every clock here is the
test's own (no sleeps)."""

from __future__ import annotations

import pytest
from botocore.exceptions import EndpointConnectionError

from messenger.channel import ChannelSpec, parse_rate
from messenger.errors import InvalidSettings
from messenger.jobs.limits import (
    UNIT_GRACE_SECONDS,
    UNLIMITED,
    ChannelLimits,
    LimiterUnavailable,
    LimitStore,
    RateLimiter,
    batch_size,
    rate_key,
)
from messenger.provision import Provisioner


class Clock:
    """Epoch seconds the test moves."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(clients, settings):
    made = LimitStore(clients, settings, clock=Clock())
    made.ensure()
    return made


def test_run_time_limits_override_the_declaration_and_clear_back(store, clients, settings):
    # Given a channel declared with 50/s per channel and 2/s per tenant
    spec = ChannelSpec("payments", namespace=settings.namespace, rate_limit="50/s",
                       tenant_rate_limit="2/s")
    Provisioner(clients, settings).ensure_channel(spec)
    assert store.get("payments") == ChannelLimits(parse_rate("50/s"), parse_rate("2/s"), None)
    # When an operator sets the channel's rate, caps concurrency and turns the tenant limit off
    view = store.set("payments", rate_limit="100/min", max_concurrency=8,
                     tenant_rate_limit=UNLIMITED, by="ops@example.com")
    assert view.limits == ChannelLimits(parse_rate("100/min"), None, 8)
    assert view.declared == ChannelLimits(parse_rate("50/s"), parse_rate("2/s"), None)
    assert view.source("rate_limit") == "set" and view.set_by == "ops@example.com"
    # Then clearing gives the rate back to the declaration
    view = store.set("payments", clear=("rate_limit", "tenant_rate_limit"), by="ops")
    assert view.limits == ChannelLimits(parse_rate("50/s"), parse_rate("2/s"), 8)
    assert view.source("rate_limit") == "declared" and view.source("max_concurrency") == "set"


@pytest.mark.parametrize(("field", "value", "says"), [
    ("rate_limit", "fast", "rate_limit must be 'N/s'"),
    ("max_concurrency", 0, "max_concurrency must be a whole number from 1 to 10000"),
    ("tenant_rate_limit", "0/s", "tenant_rate_limit must be"),
])
def test_a_bad_value_names_its_field(store, field, value, says):
    with pytest.raises(InvalidSettings, match=says):
        store.set("payments", **{field: value}, by="ops")


def test_reports_sum_fresh_processes_only(store):
    clock = store.clock
    store.report("payments", "a", rate=10.0, waiting=3)
    store.report("payments", "b", rate=15.5, waiting=1)
    clock.now += 40  # a's and b's reports go stale
    store.report("payments", "c", rate=20.0, waiting=0, stale=("a",))
    report = store.reported("payments")
    assert (report.rate, report.waiting, report.processes) == (20.0, 0, 1)
    assert set(store.reports("payments")) == {"b", "c"}


def run_processes(store, rate, processes, seconds, step=0.01):
    """Processes with a backlog each take one unit whenever they can, on the test's clock:
    the start times of every job, and the limiters (their request counts)."""
    clock = store.clock
    limiters = [RateLimiter(store, rate_key("payments"), parse_rate(rate), clock=clock)
                for _ in range(processes)]
    for limiter in limiters:
        limiter.processes = processes
    starts: list[float] = []
    waiting: list[float | None] = [None] * processes
    end = clock.now + seconds
    while clock.now < end:
        for index, limiter in enumerate(limiters):
            if waiting[index] is not None and waiting[index] <= clock.now:
                starts.append(clock.now)
                waiting[index] = None
            if waiting[index] is None:
                waiting[index] = limiter.take(1)
        clock.now += step
    return starts, limiters


def test_four_processes_keep_the_rate_in_every_window_for_a_few_requests(store):
    # Given 4 processes with a backlog on a 50/s channel, for 20 s of the test's clock
    starts, limiters = run_processes(store, "50/s", processes=4, seconds=20)
    first = starts[0]
    # Then the rate is the limit (within 5 %), and no 1-s window holds more than the limit
    # plus one batch
    assert abs(len(starts) / 20 - 50) <= 2.5
    windows = [sum(1 for s in starts if t <= s < t + 1)
               for t in (first + k * 0.05 for k in range(int(19 / 0.05)))]
    assert max(windows) <= 50 + batch_size(parse_rate("50/s"))
    assert max(windows) <= 50 * (1 + UNIT_GRACE_SECONDS) + 1
    # And the store costs at most 0.1 requests per job
    assert sum(limiter.requests for limiter in limiters) / len(starts) <= 0.1


def test_a_changed_rate_holds_from_the_next_reservation(store):
    clock = store.clock
    limiter = RateLimiter(store, rate_key("payments"), parse_rate("10/s"), clock=clock)
    assert limiter.take() == pytest.approx(clock.now)
    limiter.rate = parse_rate("1/s")
    clock.now += 2  # the old batch is past its grace
    at = limiter.take()
    assert at is not None and limiter.batch == 10 and limiter.interval == 1.0


def test_the_store_unavailable_holds_jobs_once_the_reserved_units_are_used(store, clients):
    # Given a limiter that reserved one batch
    clock = store.clock
    limiter = RateLimiter(store, rate_key("payments"), parse_rate("50/s"), clock=clock)
    assert limiter.take() is not None

    # When every DynamoDB request fails (the endpoint unreachable)
    def unreachable(request, **_):
        if request.url.startswith("http"):
            raise EndpointConnectionError(endpoint_url=request.url)

    store.dynamodb.meta.events.register("before-send.dynamodb.UpdateItem", unreachable)
    try:
        granted = 1
        for _ in range(200):
            try:
                if limiter.take() is not None:
                    granted += 1
            except LimiterUnavailable as unavailable:
                assert unavailable.retry_at > clock.now
            clock.now += 0.001
        # Then only the reserved batch ran: never more than the limit, a halt after it
        assert granted == limiter.batch
    finally:
        store.dynamodb.meta.events.unregister("before-send.dynamodb.UpdateItem", unreachable)
    # And once it answers again (after UNAVAILABLE_RETRY_SECONDS) units are handed out again
    clock.now += 3
    assert limiter.take() is not None


def test_concurrency_shares_add_up_to_the_limit_and_a_crashed_holder_expires(store):
    from messenger.jobs.limits import LEASE_SECONDS, ConcurrencyLease

    clock = store.clock
    holders = [ConcurrencyLease(store, "payments", f"p{n}") for n in range(3)]
    # Given three processes that want 8 handlers each of a channel's 10
    for _ in range(3):  # (renewals: the shares converge on an even split)
        for holder in holders:
            holder.acquire(10, 8)
        clock.now += 1
    shares = [holder.current() for holder in holders]
    assert sum(shares) <= 10 and min(shares) >= 3, shares
    # When one of them crashes (never renews) and the others renew after its lease ran out
    for _ in range(4):  # the survivors renew every third of a lease
        clock.now += LEASE_SECONDS / 3
        for holder in holders[:2]:
            holder.acquire(10, 8)
            assert sum(h.current() for h in holders) <= 10
    # Then its share is theirs, and still no more than the limit
    assert holders[2].current() == 0
    assert holders[0].current() + holders[1].current() == 10


def test_a_lease_the_store_cannot_renew_runs_out(store):
    from messenger.jobs.limits import LEASE_SECONDS, ConcurrencyLease

    clock = store.clock
    lease = ConcurrencyLease(store, "payments", "p1")
    assert lease.acquire(4, 4) == 4

    def unreachable(request, **_):
        raise EndpointConnectionError(endpoint_url=request.url)

    store.dynamodb.meta.events.register("before-send.dynamodb", unreachable)
    try:
        clock.now += LEASE_SECONDS / 2
        with pytest.raises(LimiterUnavailable):
            lease.acquire(4, 4)
        assert lease.current() == 4  # the others count it until its end
        clock.now += LEASE_SECONDS / 2
        assert lease.current() == 0  # then no handler starts
    finally:
        store.dynamodb.meta.events.unregister("before-send.dynamodb", unreachable)
