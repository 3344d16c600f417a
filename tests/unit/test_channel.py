"""ChannelSpec naming, validation and the attributes both the provisioner and the CDK use."""

import json

import pytest

from messenger.channel import (
    SQS_MAX_NAME_LENGTH,
    TAG_ALARM_THRESHOLD,
    TAG_CRITICAL,
    ChannelSpec,
    ChannelTags,
    MessageFilter,
    parse_tags,
    queue_name_for,
    topic_name_for,
)
from messenger.errors import InvalidChannelSpec


def test_single_consumer_channel_has_queue_and_dlq_but_no_topic():
    spec = ChannelSpec("orders")
    assert (spec.exchange, spec.queue_name, spec.dlq_name, spec.topic_name) == (
        None,
        "orders",
        "orders-dlq",
        None,
    )


def test_exchange_channel_names_topic_queue_and_dlq_with_namespace_and_fifo():
    spec = ChannelSpec("wishlist_events.audit_log", ordered=True, namespace="prod")
    assert spec.exchange == "wishlist_events"
    assert spec.topic_name == "prod-wishlist_events.fifo"
    assert spec.queue_name == "prod-audit_log.fifo"
    assert spec.dlq_name == "prod-audit_log-dlq.fifo"


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "must not be empty"),
        ("a.b.c", "at most one '.'"),
        ("orders.fifo", "ordered=True"),
        ("orders$", "letters, digits"),
        ("ex.", "must not be empty"),
        ("x" * 80, f"SQS allows at most {SQS_MAX_NAME_LENGTH}"),
    ],
)
def test_invalid_names_are_rejected_with_the_reason(name, fragment):
    with pytest.raises(InvalidChannelSpec, match=fragment.replace("$", r"\$").replace(".", r"\.")):
        ChannelSpec(name)


def test_name_fits_only_when_dlq_and_fifo_suffixes_fit():
    # 71 + '-dlq' (4) + '.fifo' (5) = 80: the longest ordered queue name that fits.
    ChannelSpec("q" * 71, ordered=True)
    with pytest.raises(InvalidChannelSpec, match="at most 80"):
        ChannelSpec("q" * 72, ordered=True)


def test_fifo_suffix_in_a_name_points_to_ordered():
    with pytest.raises(InvalidChannelSpec, match="ordered=True"):
        queue_name_for("orders.fifo")
    with pytest.raises(InvalidChannelSpec, match="ordered=True"):
        topic_name_for("events.fifo")


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("delay", 901, "delay must be from 0 to 900"),
        ("delay", -1, "delay must be from 0 to 900"),
        ("delay", 1.5, "delay must be a whole number"),
        ("max_receives", 0, "max_receives must be from 1 to 1000"),
        ("retention_seconds", 30, "retention_seconds must be from 60 to 1209600"),
        ("visibility_timeout", 43201, "visibility_timeout must be from 0 to 43200"),
        ("namespace", "pro d", "namespace 'pro d' may contain only"),
    ],
)
def test_out_of_range_values_name_the_field_and_range(field, value, fragment):
    with pytest.raises(InvalidChannelSpec, match=fragment):
        ChannelSpec("orders", **{field: value})


def test_filter_types_and_values_are_validated():
    with pytest.raises(InvalidChannelSpec, match="'regex' is not one of exact, prefix, exclude"):
        MessageFilter("regex", ["a"])
    with pytest.raises(InvalidChannelSpec, match="must not be empty"):
        MessageFilter("exact", [])
    with pytest.raises(InvalidChannelSpec, match="non-empty strings"):
        MessageFilter("exact", ["ok", ""])
    with pytest.raises(InvalidChannelSpec, match="list of strings"):
        MessageFilter("exact", "MOBILE")
    with pytest.raises(InvalidChannelSpec, match="at most 150"):
        MessageFilter("exact", [str(i) for i in range(151)])


def test_filter_needs_an_exchange():
    with pytest.raises(InvalidChannelSpec, match="multi-consumer channel"):
        ChannelSpec("orders", message_filter=MessageFilter("exact", ["A"]))


@pytest.mark.parametrize(
    ("message_filter", "policy", "matching", "not_matching"),
    [
        (
            MessageFilter("exact", ["MOBILE.APPLE"]),
            {"routing_key": ["MOBILE.APPLE"]},
            "MOBILE.APPLE",
            "MOBILE.APPLEX",
        ),
        (
            MessageFilter("prefix", ["MOBILE."]),
            {"routing_key": [{"prefix": "MOBILE."}]},
            "MOBILE.ANDROID",
            "WEB.MOBILE.",
        ),
        (
            MessageFilter("exclude", ["WEB"]),
            {"routing_key": [{"anything-but": ["WEB"]}]},
            "MOBILE",
            "WEB",
        ),
    ],
)
def test_filter_policy_and_local_matching_agree(message_filter, policy, matching, not_matching):
    spec = ChannelSpec("ex.q", message_filter=message_filter)
    assert spec.filter_policy() == policy
    assert json.loads(spec.filter_policy_json()) == policy
    assert message_filter.matches(matching)
    assert not message_filter.matches(not_matching)
    assert not message_filter.matches(None)


def test_queue_attributes_follow_the_spec():
    spec = ChannelSpec("q", ordered=True, delay=30, visibility_timeout=120, retention_seconds=3600)
    assert spec.queue_attributes() == {
        "DelaySeconds": "30",
        "MessageRetentionPeriod": "3600",
        "VisibilityTimeout": "120",
        "ReceiveMessageWaitTimeSeconds": "20",
        "FifoQueue": "true",
        "ContentBasedDeduplication": "true",
    }
    assert spec.dlq_attributes() == {
        "MessageRetentionPeriod": "3600",
        "FifoQueue": "true",
        "ContentBasedDeduplication": "true",
    }
    assert spec.redrive_policy("arn:dlq") == {
        "deadLetterTargetArn": "arn:dlq",
        "maxReceiveCount": 3,
    }
    assert ChannelSpec("q").topic_attributes() == {}


def test_tags_round_trip_through_resource_tags():
    tags = ChannelTags(owner="alice", team="wishlist", alarm_threshold=500, critical=True)
    resource_tags = ChannelSpec("ex.q", tags=tags, namespace="prod").resource_tags("queue")
    assert resource_tags[TAG_ALARM_THRESHOLD] == "500"
    assert resource_tags[TAG_CRITICAL] == "true"
    assert parse_tags(resource_tags) == tags
    with pytest.raises(InvalidChannelSpec, match="alarm_threshold"):
        ChannelTags(alarm_threshold=-1)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: ChannelSpec("orders", ordered="false"), "ordered must be True or False"),
        (lambda: ChannelSpec("orders", ordered=1), "ordered must be True or False"),
        (lambda: ChannelSpec("orders", track_status="yes"), "track_status must be True or False"),
        (lambda: ChannelTags(critical="no"), "tags.critical must be True or False"),
        (lambda: ChannelTags(owner=7), "tags.owner must be a string"),
    ],
)
def test_yes_no_fields_take_only_booleans(make, fragment):
    # "false" is a truthy string: taken as is it would make a FIFO channel or a critical tag
    with pytest.raises(InvalidChannelSpec, match=fragment):
        make()
