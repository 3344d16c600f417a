"""Where a consumer writes its status records from: the `status_writer` setting, and the
tracker's choice (a writer process only where the Fargate runtime asks for one)."""

from __future__ import annotations

import pytest

from messenger.consume.settings import ConsumerSettings
from messenger.consume.tracking import StatusTracker
from messenger.errors import InvalidSettings


def test_status_writer_is_read_from_its_variable_and_checked():
    assert ConsumerSettings.from_env({}).status_writer == "thread"
    assert ConsumerSettings.from_env(
        {"MESSENGER_STATUS_WRITER": "process"}).status_writer == "process"
    with pytest.raises(InvalidSettings, match="MESSENGER_STATUS_WRITER"):
        ConsumerSettings.from_env({"MESSENGER_STATUS_WRITER": "fork"})


class PreparedStore:
    """A store that only notes how it was prepared."""

    table = "t"

    def __init__(self) -> None:
        self.prepared = False
        self.recorded: list[object] = []

    def prepare(self) -> None:
        self.prepared = True

    def record(self, record: object) -> None:
        self.recorded.append(record)


def test_a_tracker_started_without_a_writer_process_writes_from_the_stores_thread():
    # Given the Lambda runtime's start (no writer process)
    store = PreparedStore()
    tracker = StatusTracker(store, consumer="c1")  # type: ignore[arg-type]
    tracker.start()
    # Then the store made its client and records go to it
    tracker.record("r")  # type: ignore[arg-type]
    assert tracker.writer is None and store.prepared and store.recorded == ["r"]
