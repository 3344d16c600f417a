"""What a status answer says of its last record (`progress_answer`), and the channel's
declaration on its resources (`ChannelSpec.resource_tags`, `declared_track_status`)."""

from __future__ import annotations

from messenger.channel import TAG_TRACK_STATUS, ChannelSpec, declared_track_status
from messenger.jobs.status import StatusEvent, StatusRecord, progress_answer


def timeline(*events: StatusEvent) -> list[StatusRecord]:
    return [StatusRecord("job-1", event, "orders", at=1_800_000_000.0 + n)
            for n, event in enumerate(events)]


def test_an_untracked_channels_last_record_is_marked_last_known():
    answer = progress_answer(timeline(StatusEvent.QUEUED), False, "orders")
    assert answer["tracked"] is False and answer["current"] is False
    assert answer["note"].startswith("progress not recorded: channel 'orders'")
    assert "QUEUED at 2027-01-15T08:00:00Z is the last recorded state" in answer["note"]


def test_a_final_state_is_current_even_untracked():
    for final in (StatusEvent.DELETED, StatusEvent.CANCELLED, StatusEvent.COMPLETED):
        answer = progress_answer(timeline(StatusEvent.QUEUED, final), False, "orders")
        assert answer == {"tracked": False, "current": True}
    # a requeue starts the job again: on an untracked channel its REQUEUED is last known only
    requeued = timeline(StatusEvent.QUEUED, StatusEvent.REQUEUED)
    assert progress_answer(requeued, False, "orders")["current"] is False


def test_a_tracked_channel_is_current():
    assert progress_answer(timeline(StatusEvent.QUEUED), True, "orders") == {
        "tracked": True, "current": True}


def test_an_undeclared_channel_is_judged_by_its_records():
    # a tracking consumer recorded this job: tracked
    consumed = timeline(StatusEvent.QUEUED, StatusEvent.RECEIVED, StatusEvent.STARTED)
    assert progress_answer(consumed, None, "orders") == {"tracked": True, "current": True}
    # nothing says: unknown, and not presented as current
    answer = progress_answer(timeline(StatusEvent.QUEUED), None, "orders")
    assert answer["tracked"] is None and answer["current"] is False
    assert answer["note"].startswith("progress may not be recorded") and TAG_TRACK_STATUS in \
        answer["note"]


def test_the_declaration_is_on_queue_and_dlq_not_on_the_topic():
    tracked = ChannelSpec("shop.audit", track_status=True)
    assert tracked.resource_tags("queue")[TAG_TRACK_STATUS] == "true"
    assert tracked.resource_tags("dlq")[TAG_TRACK_STATUS] == "true"
    assert TAG_TRACK_STATUS not in tracked.resource_tags("topic")
    assert ChannelSpec("orders").resource_tags("queue")[TAG_TRACK_STATUS] == "false"
    assert declared_track_status(tracked.resource_tags("queue")) is True
    assert declared_track_status({TAG_TRACK_STATUS: "false"}) is False
    assert declared_track_status({}) is None
