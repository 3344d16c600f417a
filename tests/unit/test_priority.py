"""Priority policy (weights, modes, validation), the consumer's priority attributes, and the
mapping of lifecycle events to status records."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from messenger import Consumer, InvalidChannelSpec, Settings
from messenger.consume.lifecycle import LifecycleEvent
from messenger.consume.tracking import consumer_id, status_record
from messenger.jobs.priority import PriorityPolicy, default_weights
from messenger.jobs.status import StatusEvent

LEVELS = ("high", "default", "low")


def test_default_weights_halve_from_level_to_level():
    assert default_weights(LEVELS) == {"high": 4, "default": 2, "low": 1}
    assert default_weights(("a", "b")) == {"a": 2, "b": 1}


def test_weighted_picks_follow_the_weights_and_interleave():
    policy = PriorityPolicy(LEVELS, {"high": 6, "default": 3, "low": 1})
    picks = [policy.pick() for _ in range(100)]
    assert Counter(picks) == {"high": 60, "default": 30, "low": 10}
    # Smooth: each round of 10 serves every level; high never runs more than twice in a row
    for start in range(0, 100, 10):
        assert set(picks[start:start + 10]) == set(LEVELS)
    assert not any(picks[i:i + 3] == ["high"] * 3 for i in range(98))


def test_order_tries_the_pick_first_then_the_rest_from_the_highest():
    policy = PriorityPolicy(LEVELS, {"high": 1, "default": 1, "low": 5})
    assert policy.order() == ["low", "high", "default"]


def test_strict_always_starts_with_the_highest_level():
    policy = PriorityPolicy(LEVELS, mode="strict")
    assert [policy.order() for _ in range(3)] == [list(LEVELS)] * 3


@pytest.mark.parametrize(
    ("weights", "mode", "fragment"),
    [
        ({"high": 2, "default": 1, "low": 1, "urgent": 9}, "weighted",
         "Jobs.priority_weights names 'urgent', which is not one of high, default, low"),
        ({"high": 0, "default": 1, "low": 1}, "weighted",
         r"Jobs.priority_weights\['high'\] must be a whole number >= 1, got 0"),
        ({"high": 1.5, "default": 1, "low": 1}, "weighted", "whole number >= 1, got 1.5"),
        ({"high": True, "default": 1, "low": 1}, "weighted", "whole number >= 1, got True"),
        ({"high": 2}, "weighted", "gives no weight to default, low"),
        ([4, 2, 1], "weighted", "must map each level"),
        (None, "fifo", "Jobs.priority_mode 'fifo' is not one of weighted, strict"),
    ],
)
def test_bad_weights_and_modes_are_rejected_naming_the_field(weights, mode, fragment):
    with pytest.raises(InvalidChannelSpec, match=fragment):
        PriorityPolicy(LEVELS, weights, mode, owner="Jobs")


class Jobs(Consumer):
    channel = "jobs"
    priorities = LEVELS
    priority_weights = {"high": 3, "default": 2, "low": 1}
    track_status = True

    def handler(self, message: Any) -> None:
        pass


def test_the_consumer_passes_its_levels_and_tracking_to_the_channel_spec():
    consumer = Jobs(settings=Settings(namespace="ns"))
    assert consumer.spec.priorities == LEVELS and consumer.spec.track_status
    assert consumer.spec.default_level == "default"
    assert [s.queue_name for s in consumer.spec.level_specs()] == [
        "ns-jobs-high", "ns-jobs-default", "ns-jobs-low"]
    assert consumer.policy is not None and consumer.policy.weights["high"] == 3
    assert consumer.status is not None
    assert consumer.status.store.retention_seconds == consumer.spec.retention_seconds


def test_consumer_priority_attributes_are_validated():
    class Unknown(Jobs):
        priority_weights = {"high": 3, "medium": 1}

    class WithoutLevels(Jobs):
        priorities = ()
        priority_mode = "strict"

    class BadDefault(Jobs):
        default_priority = "urgent"

    with pytest.raises(InvalidChannelSpec, match="Unknown.priority_weights names 'medium'"):
        Unknown(settings=Settings())
    with pytest.raises(InvalidChannelSpec, match="WithoutLevels.priority_weights and "
                                                 "priority_mode need priorities"):
        WithoutLevels(settings=Settings())
    with pytest.raises(InvalidChannelSpec, match="default_priority 'urgent' is not one of"):
        BadDefault(settings=Settings())


def event(name: str, duration: float | None = None, **fields: Any) -> LifecycleEvent:
    return LifecycleEvent(name, "jobs", "m-1", duration, fields, at=100.0)


def test_lifecycle_events_map_to_status_records():
    failed = status_record(event("failed", 0.5, error="ValueError: bad sku",
                                 error_class="ValueError", receive_count=2), "c-1")
    assert failed is not None
    assert (failed.event, failed.error_class, failed.error, failed.duration, failed.receive_count,
            failed.consumer_id, failed.at) == (StatusEvent.FAILED, "ValueError", "bad sku", 0.5, 2,
                                               "c-1", 100.0)
    timed_out = status_record(event("timed_out", 1.2, processing_timeout=1, receive_count=1), "c")
    assert timed_out is not None and timed_out.event is StatusEvent.TIMED_OUT
    assert (timed_out.error_class, timed_out.error) == ("ProcessingTimeout", "exceeded 1 s")
    dead = status_record(event("dead_lettered", reason="undecodable: x", receive_count=1), "c")
    assert dead is not None and (dead.event, dead.error) == (StatusEvent.DEAD_LETTERED,
                                                             "undecodable: x")
    names = ["received", "started", "completed", "retried"]
    assert [status_record(event(n, receive_count=1), "c").event for n in names] == [  # type: ignore[union-attr]
        StatusEvent.RECEIVED, StatusEvent.STARTED, StatusEvent.COMPLETED, StatusEvent.RETRIED]
    # Consumer states, warnings and shutdown releases are log-only
    assert status_record(event("released", reason="shutdown"), "c") is None
    assert status_record(LifecycleEvent("state", "jobs", None, None, {"state": "IDLE"}), "c") \
        is None


def test_consumer_id_prefers_the_setting_then_the_ecs_task_then_host_and_pid():
    import os
    import socket

    assert consumer_id({"MESSENGER_CONSUMER_ID": "orders-1"}) == "orders-1"
    ecs = {"ECS_CONTAINER_METADATA_URI_V4":
           "http://169.254.170.2/v4/a8ab3e5a5d5c4e0e8e2a6b6e1f4d9c4c-1234567890"}
    assert consumer_id(ecs) == f"ecs-a8ab3e5a5d5c4e0e8e2a6b6e1f4d9c4c-{os.getpid()}"
    assert consumer_id({}) == f"{socket.gethostname()}-{os.getpid()}"
