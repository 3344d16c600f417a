"""Which timelines say a job is running (`running_channel`): the decision the dashboard's Cancel
button of a running job follows, table-tested without a table."""

from __future__ import annotations

import pytest

from messenger.jobs.status import (
    RUNNING_EVENTS,
    StatusEvent,
    StatusRecord,
    records_of_item,
    running_channel,
    status_items,
)

E = StatusEvent


def timeline(*events: StatusEvent, channel: str = "orders", start: float = 1_800_000_000.0
             ) -> list[StatusRecord]:
    return [StatusRecord("job-1", event, channel, at=start + n)
            for n, event in enumerate(events)]


@pytest.mark.parametrize(("events", "running"), [
    ((), False),
    ((E.QUEUED,), False),
    ((E.SCHEDULED,), False),
    ((E.QUEUED, E.RECEIVED), True),
    ((E.QUEUED, E.RECEIVED, E.STARTED), True),
    ((E.QUEUED, E.RECEIVED, E.STARTED, E.COMPLETED), False),
    ((E.QUEUED, E.RECEIVED, E.STARTED, E.FAILED), False),
    ((E.QUEUED, E.RECEIVED, E.STARTED, E.FAILED, E.RETRIED), False),
    # a retry received again: running again
    ((E.QUEUED, E.RECEIVED, E.STARTED, E.FAILED, E.RETRIED, E.RECEIVED, E.STARTED), True),
    ((E.QUEUED, E.RECEIVED, E.STARTED, E.TIMED_OUT), False),
    ((E.QUEUED, E.RECEIVED, E.STARTED, E.DEAD_LETTERED), False),
    ((E.QUEUED, E.RECEIVED, E.DEAD_LETTERED, E.REQUEUED), False),
    ((E.QUEUED, E.RECEIVED, E.STARTED, E.CANCELLED), False),
    ((E.QUEUED, E.DUPLICATE), False),
    ((E.QUEUED, E.DEAD_LETTERED, E.DELETED), False),
])
def test_a_job_runs_while_its_last_record_is_received_or_started(events, running):
    assert running_channel(timeline(*events)) == ("orders" if running else "")


def test_the_running_events_are_received_and_started_only():
    assert RUNNING_EVENTS == {E.RECEIVED, E.STARTED}
    for event in E:
        assert (running_channel(timeline(E.QUEUED, event)) != "") is (event in RUNNING_EVENTS)


def test_the_channel_is_the_last_records():
    # a job requeued onto another channel and received there runs on that one
    records = [*timeline(E.QUEUED, E.RECEIVED, E.DEAD_LETTERED, channel="orders"),
               *timeline(E.REQUEUED, E.RECEIVED, channel="orders-replay",
                         start=1_800_000_060.0)]
    assert running_channel(records) == "orders-replay"


def test_records_read_back_from_their_items_decide_alike():
    # Given a consumer's records written together (one item) and read back
    written = timeline(E.QUEUED, E.RECEIVED, E.STARTED)
    read = [r for item in status_items(written, 3600) for r in records_of_item(item)]
    # Then the timeline read back says running, as the records written do
    assert running_channel(read) == running_channel(written) == "orders"
