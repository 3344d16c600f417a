"""A read over several DLQs scans them at once, against the local endpoint: its DLQs' last
(empty) long polls overlap instead of following one another, the letters come back in the
sources' order, a limited read still reads its DLQs in turn and stops exactly at the limit, and a
failure or an interrupt on one source still releases what every source held."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import ClientError

from messenger import Message
from messenger.aws import ClientFactory
from messenger.operations.deadletters import DeadLetterWorkbench
from messenger.operations.selection import SearchQuery, search
from tests.faults import injected
from tests.integration.test_dlq_workbench import channel, counts, dead_letter

LEVELS = ("high", "mid", "low")


@dataclass
class Receive:
    queue: str
    started: float
    ended: float = 0.0
    received: int = 0
    wait: int | None = None


@dataclass
class Receives:
    """botocore `before-parameter-build` / `after-call` hooks on ReceiveMessage: when each call
    started and ended (monotonic), on which queue, and what it returned."""

    calls: list[Receive] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def before(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        call = Receive(params["QueueUrl"].rsplit("/", 1)[-1], time.monotonic(),
                       wait=params.get("WaitTimeSeconds"))
        context["test_receive"] = call
        with self.lock:
            self.calls.append(call)

    def after(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        call = context["test_receive"]
        call.received, call.ended = len(parsed.get("Messages", [])), time.monotonic()

    def last_polls(self) -> dict[str, Receive]:
        """Each queue's last receive (the one that came back empty: its scan ended)."""
        return {call.queue: call for call in self.calls}


@contextmanager
def recorded(clients: ClientFactory) -> Iterator[Receives]:
    receives = Receives()
    with ExitStack() as stack:
        stack.enter_context(injected(clients, "before-parameter-build.sqs.ReceiveMessage",
                                     receives.before))
        stack.enter_context(injected(clients, "after-call.sqs.ReceiveMessage", receives.after))
        yield receives


def overlap(calls: list[Receive]) -> bool:
    """Whether all these calls were in flight together at some moment."""
    return max(c.started for c in calls) < min(c.ended for c in calls)


def prioritized(settings, clients, per_level: int):
    """A channel 'jobs' with three priority levels, `per_level` letters in each level's DLQ
    ('high-0', ...); returns its levels' resources."""
    resources = channel(settings, clients, name="jobs", priorities=LEVELS)
    sqs = clients.client("sqs")
    for level, name in zip(resources.levels, LEVELS, strict=True):
        for n in range(per_level):
            dead_letter(sqs, level.dlq.url, Message({"n": n}, message_id=f"{name}-{n}"))
    return resources.levels


def test_a_read_over_three_dlqs_polls_them_at_once_in_their_order(settings, clients):
    # Given a channel whose three levels' DLQs hold 3 letters each
    levels = prioritized(settings, clients, per_level=3)
    bench = DeadLetterWorkbench("jobs", settings, clients)
    # When the whole channel is listed
    with recorded(clients) as receives:
        listing = bench.list()
    # Then the three scans' last long polls (WaitTimeSeconds=1, empty) were in flight together:
    # the read costs about one poll, not three
    last = receives.last_polls()
    assert sorted(last) == sorted(bench.dlqs)
    assert all(call.received == 0 for call in last.values())
    assert all(call.wait == 1 for call in receives.calls)
    assert overlap(list(last.values())), receives.calls
    # And the letters come in the sources' order (as a read one after the other returns them),
    # every one once, all visible again
    assert [x.dlq for x in listing.letters] == [dlq for dlq in bench.dlqs for _ in range(3)]
    assert sorted(x.id for x in listing.letters) == sorted(f"{n}-{k}" for n in LEVELS
                                                           for k in range(3))
    assert listing.dlqs == bench.dlqs and listing.not_seen == 0
    sqs = clients.client("sqs")
    assert [counts(sqs, level.dlq.url) for level in levels] == [(3, 0)] * 3
    # And a show finds a letter of the last level the same way, releasing all
    with recorded(clients) as receives:
        letter, _, _ = bench.show("low-1")
    assert letter.id == "low-1" and overlap(list(receives.last_polls().values()))
    assert [counts(sqs, level.dlq.url) for level in levels] == [(3, 0)] * 3


def test_a_limited_read_takes_its_dlqs_in_turn_and_stops_exactly_at_the_limit(settings, clients):
    levels = prioritized(settings, clients, per_level=4)
    bench = DeadLetterWorkbench("jobs", settings, clients)
    # When 6 are asked for: the first source's 4, then 2 of the second's
    with recorded(clients) as receives:
        listing = bench.list(limit=6)
    first, second, third = bench.dlqs
    assert [x.dlq for x in listing.letters] == [first] * 4 + [second] * 2
    assert listing.stopped_at_limit
    # Then the levels were read one after the other (the third not at all)
    order = [call.queue for call in receives.calls]
    assert order == sorted(order, key=bench.dlqs.index) and third not in order
    assert all(a.ended <= b.started for a, b in zip(receives.calls, receives.calls[1:],
                                                        strict=False))
    sqs = clients.client("sqs")
    assert [counts(sqs, level.dlq.url) for level in levels] == [(4, 0)] * 3


def test_a_failing_dlq_still_releases_what_every_scan_held(settings, clients):
    # Given three levels with 2 letters each, the last level's DLQ refusing its second receive
    # once the other two scans hold their letters
    levels = prioritized(settings, clients, per_level=2)
    bench = DeadLetterWorkbench("jobs", settings, clients)
    failing = bench.dlqs[2]
    others_hold = threading.Barrier(3, timeout=10)
    calls: dict[str, int] = {}

    def refuse(params: dict[str, Any], **_: Any) -> None:
        queue = params["QueueUrl"].rsplit("/", 1)[-1]
        calls[queue] = calls.get(queue, 0) + 1
        if calls[queue] == 2:  # each scan's first receive returned its letters: all hold some
            others_hold.wait()
            if queue == failing:
                raise ClientError({"Error": {"Code": "AccessDenied",
                                             "Message": f"injected on {queue}"}},
                                  "ReceiveMessage")

    # When the channel is listed
    with injected(clients, "before-parameter-build.sqs.ReceiveMessage", refuse):
        with pytest.raises(ClientError, match=f"injected on {failing}"):
            bench.list()
    # Then every letter of every level is visible again at once, the failing level's too
    sqs = clients.client("sqs")
    assert [counts(sqs, level.dlq.url) for level in levels] == [(2, 0)] * 3


class Interrupted(BaseException):
    """What the test's signal handler raises in the main thread, as Ctrl-C raises
    KeyboardInterrupt."""


def test_an_interrupted_read_releases_what_every_scan_held(settings, clients):
    levels = prioritized(settings, clients, per_level=2)
    bench = DeadLetterWorkbench("jobs", settings, clients)
    main = threading.main_thread().ident
    holding: set[str] = set()

    def interrupt_once_all_hold(parsed: dict[str, Any], context: dict[str, Any],
                                **_: Any) -> None:
        if parsed.get("Messages"):
            holding.add(context["test_receive"].queue)
            if len(holding) == 3:  # every scan holds letters and is about to poll again
                signal.pthread_kill(main, signal.SIGUSR1)

    def raise_interrupted(*_: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    try:
        with recorded(clients), injected(clients, "after-call.sqs.ReceiveMessage",
                                         interrupt_once_all_hold):
            with pytest.raises(Interrupted):
                bench.list()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert len(holding) == 3
    sqs = clients.client("sqs")
    assert [counts(sqs, level.dlq.url) for level in levels] == [(2, 0)] * 3


def test_a_search_reads_the_channels_at_once(settings, clients):
    # Given three channels with 2 letters each
    sqs = clients.client("sqs")
    for name in ("alpha", "beta", "gamma"):
        resources = channel(settings, clients, name=name)
        for n in range(2):
            dead_letter(sqs, resources.dlq.url, Message({"text": f"card declined {n}"},
                                                        message_id=f"{name}-{n}"))
    # When every channel is searched (a factory of the search's own, as the dashboard's)
    own = ClientFactory(clients.region, clients.endpoint_url)
    with recorded(own) as receives:
        result = search(own, settings, SearchQuery(text="declined"))
    # Then the channels' last long polls were in flight together, and the letters are in the
    # channels' order
    last = list(receives.last_polls().values())
    assert len(last) == 3 and all(call.received == 0 for call in last)
    assert overlap(last), receives.calls
    assert [(name, x.id) for name, x in result.letters] == [
        (name, f"{name}-{n}") for name in ("alpha", "beta", "gamma") for n in range(2)]
