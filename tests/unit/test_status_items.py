"""A job's status records written together share one item, and read back whole."""

from __future__ import annotations

from messenger.jobs.status import (
    StatusEvent,
    StatusRecord,
    records_of_item,
    status_items,
)

DAY = 86_400


def test_a_messages_records_share_one_item_and_read_back_whole() -> None:
    # Given a consumer's three records of one job and one record of another, interleaved
    received = StatusRecord("job-1", StatusEvent.RECEIVED, "orders", at=100.0,
                            consumer_id="c1", receive_count=1)
    other = StatusRecord("job-2", StatusEvent.QUEUED, "orders", at=100.5)
    started = StatusRecord("job-1", StatusEvent.STARTED, "orders", at=100.001,
                           consumer_id="c1", receive_count=1)
    failed = StatusRecord("job-1", StatusEvent.FAILED, "orders", at=100.2, consumer_id="c1",
                          receive_count=1, duration=0.0, error_class="ValueError",
                          error="bad", traceback="Traceback ...")
    # When they are turned into items
    items = status_items([received, other, started, failed], DAY)
    # Then one item per message, in the order of its first record
    assert [i["message_id"]["S"] for i in items] == ["job-1", "job-2"]
    assert items[1] == other.item(DAY)  # a lone record keeps the plain format
    assert items[0]["sk"] == received.item(DAY)["sk"]
    assert items[0]["event"] == {"S": "RECEIVED"}
    assert items[0]["expires_at"] == {"N": str(int(100.2 + DAY))}
    # and each item reads back as exactly the records it stores (a duration of 0.0 included)
    assert records_of_item(items[0]) == [received, started, failed]
    assert records_of_item(items[1]) == [other]


def test_a_scheduled_records_item_outlives_its_wait() -> None:
    scheduled = StatusRecord("job-3", StatusEvent.SCHEDULED, "orders", at=10.0, due_at=5000.0)
    queued = StatusRecord("job-3", StatusEvent.QUEUED, "orders", at=11.0, actor="scheduler")
    [item] = status_items([scheduled, queued], DAY)
    assert item["expires_at"] == {"N": str(int(5000.0 + DAY))}
    assert records_of_item(item) == [scheduled, queued]
