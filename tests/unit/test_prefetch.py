"""Bounded prefetch: what the receiver asks for and when (`messenger.consume.prefetch`, on a
clock the tests set), the work queue's release of messages that waited too long, the setting."""

from __future__ import annotations

import threading
import time

import pytest

from messenger import ConsumerSettings, InvalidSettings
from messenger.consume.mailbox import Delivery
from messenger.consume.prefetch import (
    MAX_RECEIVES_IN_FLIGHT,
    OUTLIER,
    PAUSE_SECONDS,
    SLACK_SECONDS,
    FetchPlan,
    Prefetch,
)
from messenger.consume.runtime import WorkQueue

NOW = 1000.0


def measured(limit: float = 0.5, round_trip: float = 0.02) -> Prefetch:
    """A prefetch whose receives took `round_trip` each, exactly (no deviation)."""
    prefetch = Prefetch(limit)
    for _ in range(30):
        prefetch.observe_poll(round_trip, asked=10, got=10)
    return prefetch


def test_only_polls_answered_in_full_time_the_round_trip():
    prefetch = Prefetch(0.5)
    # A poll that got fewer than it asked for may have waited for them: not a round trip
    prefetch.observe_poll(3.0, asked=10, got=2)
    prefetch.observe_poll(20.0, asked=10, got=0)
    assert prefetch.round_trip is None
    prefetch.observe_poll(0.02, asked=4, got=4)
    assert prefetch.round_trip == pytest.approx(0.02)
    # a slower full poll moves the average and widens the lead by its deviation
    prefetch.observe_poll(0.07, asked=10, got=10)
    assert 0.02 < prefetch.round_trip < 0.07
    assert prefetch.lead() > prefetch.round_trip
    # a poll for one message that waited 20 s for it counts as 4 times the average, no more
    before = prefetch.round_trip
    prefetch.observe_poll(20.0, asked=1, got=1)
    assert prefetch.round_trip == pytest.approx(before + 0.2 * 3 * before)


def test_prefetch_waits_for_both_measures_and_is_off_at_zero_for_fast_handlers_or_paused():
    prefetch = Prefetch(0.5)
    assert not prefetch.active(NOW, 0.05)  # no round trip yet
    prefetch.observe_poll(0.02, 10, 10)
    assert not prefetch.active(NOW, None)  # no time per message yet
    assert prefetch.active(NOW, 0.05)
    # messages that take under a millisecond (handlers that do not wait): free workers only
    assert not prefetch.active(NOW, 0.0005)
    prefetch.pause(NOW)
    assert not prefetch.active(NOW + PAUSE_SECONDS - 0.1, 0.05)
    assert prefetch.active(NOW + PAUSE_SECONDS, 0.05)
    assert not measured(limit=0.0).active(NOW, 0.05)


def test_free_workers_are_fetched_for_at_once():
    # Given 10 workers, 3 of them free, 7 running 200 ms messages that started just now
    plan = measured().plan(NOW, 10, [NOW] * 7, 0, 0.2, 10)
    # Then the poll goes now, for the free ones (the others end after the horizon)
    assert plan == FetchPlan(3)


def test_a_pool_busy_with_long_handlers_fetches_nothing_until_a_round_trip_before_its_end():
    prefetch = measured(round_trip=0.02)
    started = [NOW - 1.0] * 10  # 10 workers, each 1 s into a message that takes 5 s
    plan = prefetch.plan(NOW, 10, started, 0, 5.0, 10)
    # Then nothing is fetched: the next poll is planned a round trip before they end
    assert plan.count == 0 and plan.wait == pytest.approx(4.0 - 0.02, abs=1e-3)
    # and at that moment the poll asks for all 10, which arrive as the workers free up
    later = NOW + plan.wait
    assert prefetch.plan(later, 10, started, 0, 5.0, 10) == FetchPlan(10)


def test_workers_ending_just_after_the_answer_join_the_poll_and_no_further():
    prefetch = measured(round_trip=0.02)
    # Given workers ending 0.02 s (the round trip), 0.06 s and 0.5 s from now
    busy = 0.1
    started = [NOW - busy + 0.02, NOW - busy + 0.06, NOW - busy + 0.5]
    plan = prefetch.plan(NOW, 3, started, 0, busy, 10)
    # Then the poll goes now for the first and the second (within the slack of the answer)
    assert 0.06 - 0.02 <= SLACK_SECONDS
    assert plan == FetchPlan(2)


def test_a_handler_running_much_longer_than_usual_is_not_fetched_for():
    prefetch = measured(round_trip=0.02)
    # Given one worker whose 200 ms message has run 1.5 s (a surprise slow handler)
    plan = prefetch.plan(NOW, 1, [NOW - 1.5], 0, 0.2, 10)
    # Then nothing is fetched for it, and no poll is planned (its end will wake the receiver)
    assert plan == FetchPlan(0, None)
    # while one late by less than a second is still expected any moment (the receiver itself
    # may wake late on a busy machine)
    assert prefetch.plan(NOW, 1, [NOW - 1.1], 0, 0.2, 10) == FetchPlan(1)


def test_messages_already_waiting_go_to_the_workers_that_free_up_first():
    prefetch = measured(round_trip=0.02)
    # Given 10 workers whose 100 ms messages end in 10 ms, and a poll's 10 messages already
    # waiting for them
    started = [NOW - 0.09] * 10
    plan = prefetch.plan(NOW, 10, started, 10, 0.1, 10)
    # Then nothing more is fetched: those workers are busy until 110 ms from now
    assert plan.count == 0 and plan.wait == pytest.approx(0.11 - 0.02, abs=1e-3)
    # and with 3 waiting, the poll asks for the other 7
    assert prefetch.plan(NOW, 10, started, 3, 0.1, 10) == FetchPlan(7)


def test_a_slow_round_trip_never_fetches_further_ahead_than_half_the_limit():
    # Given receives that take 3 s, and a limit of 0.5 s in memory
    prefetch = measured(limit=0.5, round_trip=3.0)
    # When a worker ends in 2 s, then nothing is fetched for it until 0.25 s before
    plan = prefetch.plan(NOW, 1, [NOW - 1.0], 0, 3.0, 10)
    assert plan.count == 0 and plan.wait == pytest.approx(1.75, abs=1e-3)
    assert prefetch.plan(NOW + 1.75, 1, [NOW - 1.0], 0, 3.0, 10) == FetchPlan(1)


def test_a_receive_in_flight_counts_as_its_messages_arriving_a_round_trip_after_it_was_sent():
    prefetch = measured(round_trip=0.02)
    # Given 10 workers whose 200 ms messages end in 10 ms
    started = [NOW - 0.19] * 10
    assert prefetch.plan(NOW, 10, started, 0, 0.2, 10) == FetchPlan(10)
    # When a receive for 10 was sent just now (answering in 20 ms)
    plan = prefetch.plan(NOW, 10, started, 0, 0.2, 10, in_flight=[(NOW, 10)])
    # Then nothing more is asked for: its messages keep those workers busy until 220 ms from
    # now, and the next poll is planned a round trip before that
    assert plan.count == 0 and plan.wait == pytest.approx(0.22 - 0.02, abs=1e-3)
    # and a receive for 4 leaves the 6 others to fetch for
    assert prefetch.plan(NOW, 10, started, 0, 0.2, 10, in_flight=[(NOW, 4)]) == FetchPlan(6)


def test_workers_that_outrun_one_round_trip_get_a_second_receive_before_the_first_answers():
    prefetch = measured(round_trip=0.02)
    # Given 10 idle workers of 10 ms messages and a receive for 10 sent just now: its messages
    # arrive in 20 ms and keep the workers busy until 30 ms from now
    plan = prefetch.plan(NOW, 10, [], 0, 0.01, 10, in_flight=[(NOW, 10)])
    # Then the next receive is planned a round trip before that, while the first is in flight
    assert plan.count == 0 and plan.wait == pytest.approx(0.01, abs=1e-3)
    later = NOW + plan.wait
    assert later < NOW + prefetch.round_trip
    assert prefetch.plan(later, 10, [], 0, 0.01, 10, in_flight=[(NOW, 10)]) == FetchPlan(10)
    # and a third 10 ms later, for the workers once both batches have run
    third = prefetch.plan(later, 10, [], 0, 0.01, 10, in_flight=[(NOW, 10), (later, 10)])
    assert third.count == 0 and third.wait == pytest.approx(0.01, abs=1e-3)
    assert prefetch.plan(later + third.wait, 10, [], 0, 0.01, 10,
                         in_flight=[(NOW, 10), (later, 10)]) == FetchPlan(10)


def test_a_late_receive_in_flight_does_not_put_off_the_next_until_it_answers():
    prefetch = measured(round_trip=0.01)
    # Given 10 idle workers of 20 ms messages (longer than the 10 ms lead) and a receive for 10
    # sent 20 ms ago that has not answered (its messages count as arriving now, whenever now is)
    late = [(NOW - 0.02, 10)]
    # Then a receive goes out now for the workers out of work within the horizon once those
    # have run, rather than a lead before a moment that moves on with the clock
    assert prefetch.plan(NOW, 10, [], 0, 0.02, 10, in_flight=late) == FetchPlan(10)
    assert prefetch.plan(NOW + 0.015, 10, [], 0, 0.02, 10, in_flight=late) == FetchPlan(10)
    # while one answering in time still waits for its moment
    plan = prefetch.plan(NOW, 10, [], 0, 0.02, 10, in_flight=[(NOW, 10)])
    assert plan.count == 0 and plan.wait == pytest.approx(0.02, abs=1e-3)
    # and a late one whose messages keep every worker busy past the horizon asks for nothing
    assert prefetch.plan(NOW, 10, [], 0, 0.5, 10, in_flight=late).count == 0


def test_a_receive_in_flight_for_several_round_trips_is_a_long_poll_on_a_dry_queue():
    prefetch = measured(round_trip=0.01)
    # Given 10 idle workers and a receive in flight for more than OUTLIER round trips (waiting
    # for messages to arrive, not for the endpoint)
    waiting = [(NOW - (OUTLIER + 0.5) * 0.01, 10)]
    # Then no other receive goes out beside it (it would be another empty long poll) until
    # it answers
    assert prefetch.plan(NOW, 10, [], 0, 0.02, 10, in_flight=waiting) == FetchPlan(0, None)
    assert prefetch.plan(NOW, 10, [], 0, 0.02, 10) == FetchPlan(10)


def test_never_more_than_the_cap_of_receives_in_flight():
    prefetch = measured(round_trip=0.02)
    # Given 10 idle workers of 10 ms messages, which would want more than 3 receives' worth
    in_flight = [(NOW - 0.03, 1)] * (MAX_RECEIVES_IN_FLIGHT - 1)
    assert prefetch.plan(NOW, 10, [], 0, 0.01, 10, in_flight=in_flight).count > 0
    # Then with the cap in flight nothing more is asked for until one answers
    in_flight.append((NOW - 0.03, 1))
    assert prefetch.plan(NOW, 10, [], 0, 0.01, 10, in_flight=in_flight) == FetchPlan(0, None)


def test_one_receive_in_flight_once_a_poll_came_back_short():
    prefetch = measured(round_trip=0.02)
    assert prefetch.last_full
    # Given the last poll brought 3 of the 10 messages it asked for (the queue running dry)
    prefetch.observe_poll(0.02, asked=10, got=3)
    assert not prefetch.last_full
    # Then, with a receive in flight, nothing more is asked for however many workers are idle
    assert prefetch.plan(NOW, 10, [], 0, 0.01, 10, in_flight=[(NOW - 0.03, 1)]) == \
        FetchPlan(0, None)
    # while with none in flight the poll goes for the idle workers, as before
    assert prefetch.plan(NOW, 10, [], 0, 0.01, 10) == FetchPlan(10)
    # and a full poll again allows more than one
    prefetch.observe_poll(0.02, asked=10, got=10)
    assert prefetch.plan(NOW, 10, [], 0, 0.01, 10, in_flight=[(NOW - 0.03, 1)]).count > 0


def chain(received_at: float, name: str) -> list[Delivery]:
    return [Delivery({"ReceiptHandle": f"r-{name}", "MessageId": name}, received_at, 30.0)]


def test_the_work_queue_gives_up_chains_that_waited_too_long_behind_busy_workers():
    work = WorkQueue()
    work.put([chain(NOW, "a"), chain(NOW + 0.1, "b"), chain(NOW + 0.3, "c")], wake=0)
    # Given no worker is idle: the chains received at the cutoff or before come out, in order,
    # and the next due is when the oldest left was received
    taken, oldest = work.overdue(cutoff=NOW + 0.1)
    assert [c[0].sqs_message_id for c in taken] == ["a", "b"] and oldest == NOW + 0.3
    # While a worker is idle, nothing waits behind busy workers: nothing comes out
    got: list[list[Delivery] | None] = []
    idle = threading.Thread(target=lambda: got.append(work.take()))
    work.take()  # "c": now the queue is empty and the next take waits
    idle.start()
    deadline = time.monotonic() + 5
    while not work._idle and time.monotonic() < deadline:
        time.sleep(0.01)
    work.put([chain(NOW + 0.4, "d")], wake=0)
    assert work.overdue(cutoff=NOW + 10) == ([], None)
    work.wake_waiting()
    idle.join(5)
    assert got and got[0] is not None and got[0][0].sqs_message_id == "d"
    # drain (shutdown) takes whatever waits
    work.put([chain(NOW, "e"), chain(NOW, "f")], wake=0)
    assert [c[0].sqs_message_id for c in work.drain()] == ["e", "f"]
    assert work.overdue(cutoff=NOW + 10) == ([], None)


def test_prefetch_wait_is_read_from_its_variable_and_checked():
    assert ConsumerSettings.from_env({}).prefetch_wait == 0.5
    assert ConsumerSettings.from_env({"MESSENGER_PREFETCH_WAIT_SECONDS": "0"}).prefetch_wait == 0
    assert ConsumerSettings.from_env(
        {"MESSENGER_PREFETCH_WAIT_SECONDS": "2.5"}).prefetch_wait == 2.5
    for bad in ("-1", "nan", "6"):
        with pytest.raises(InvalidSettings, match=r"prefetch_wait "
                                                  r"\(MESSENGER_PREFETCH_WAIT_SECONDS\)") as error:
            ConsumerSettings.from_env({"MESSENGER_PREFETCH_WAIT_SECONDS": bad})
        assert "\n" not in str(error.value)
    with pytest.raises(InvalidSettings, match="MESSENGER_PREFETCH_WAIT_SECONDS must be a number"):
        ConsumerSettings.from_env({"MESSENGER_PREFETCH_WAIT_SECONDS": "soon"})
