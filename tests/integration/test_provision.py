"""Runtime provisioning from a ChannelSpec: idempotent, secure by default, verify mode."""

from __future__ import annotations

import json

import pytest

from messenger import ChannelNotFound, ChannelSpec, ChannelTags, MessageFilter
from messenger.aws import RequestCounter
from messenger.channel import TAG_CHANNEL, TAG_CRITICAL, TAG_MANAGED, TAG_OWNER, exchange_tags
from messenger.provision import Provisioner


def test_channel_resources_follow_the_spec(settings, clients):
    spec = ChannelSpec(
        "shop.audit",
        ordered=True,
        delay=5,
        visibility_timeout=90,
        max_receives=4,
        message_filter=MessageFilter("prefix", ["ORDER."]),
        namespace=settings.namespace,
        tags=ChannelTags(owner="alice", critical=True),
    )
    resources = Provisioner(clients, settings).ensure_channel(spec)
    sqs, sns = clients.client("sqs"), clients.client("sns")
    attributes = sqs.get_queue_attributes(QueueUrl=resources.queue.url, AttributeNames=["All"])[
        "Attributes"
    ]
    for name, value in spec.queue_attributes().items():
        assert attributes[name] == value, name
    assert json.loads(attributes["RedrivePolicy"]) == {
        "deadLetterTargetArn": resources.dlq.arn,
        "maxReceiveCount": 4,
    }
    assert attributes["KmsMasterKeyId"].startswith("arn:aws:kms:")
    policy = json.loads(attributes["Policy"])
    assert {s["Sid"] for s in policy["Statement"]} == {
        "DenyInsecureTransport",
        "AllowExchangeTopic",
    }
    dlq_attributes = sqs.get_queue_attributes(QueueUrl=resources.dlq.url, AttributeNames=["All"])[
        "Attributes"
    ]
    assert dlq_attributes["FifoQueue"] == "true"
    assert dlq_attributes["MessageRetentionPeriod"] == str(14 * 86400)
    tags = sqs.list_queue_tags(QueueUrl=resources.queue.url)["Tags"]
    assert (tags[TAG_MANAGED], tags[TAG_OWNER], tags[TAG_CRITICAL]) == ("true", "alice", "true")
    subscription = sns.get_subscription_attributes(SubscriptionArn=resources.subscription_arn)[
        "Attributes"
    ]
    assert subscription["RawMessageDelivery"] == "true"
    assert json.loads(subscription["FilterPolicy"]) == spec.filter_policy()
    topic = sns.get_topic_attributes(TopicArn=resources.topic_arn)["Attributes"]
    assert topic["FifoTopic"] == "true" and topic["KmsMasterKeyId"].startswith("arn:aws:kms:")


def test_provisioning_twice_changes_nothing_and_a_new_filter_is_applied(settings, clients):
    spec = ChannelSpec(
        "shop.audit", message_filter=MessageFilter("exact", ["A"]), namespace=settings.namespace
    )
    provisioner = Provisioner(clients, settings)
    first = provisioner.ensure_channel(spec)
    assert provisioner.ensure_channel(spec) == first
    sns = clients.client("sns")
    assert len(sns.list_subscriptions_by_topic(TopicArn=first.topic_arn)["Subscriptions"]) == 1
    changed = ChannelSpec(
        "shop.audit", message_filter=MessageFilter("exclude", ["B"]), namespace=settings.namespace
    )
    again = provisioner.ensure_channel(changed)
    assert again.subscription_arn == first.subscription_arn
    attributes = sns.get_subscription_attributes(SubscriptionArn=first.subscription_arn)[
        "Attributes"
    ]
    assert json.loads(attributes["FilterPolicy"]) == changed.filter_policy()


def test_a_second_provisioner_reuses_the_key_and_checks_cheaply(settings, clients):
    spec = ChannelSpec("orders", namespace=settings.namespace)
    Provisioner(clients, settings).ensure_channel(spec)
    counter = RequestCounter().attach(clients)
    Provisioner(clients, settings).ensure_channel(spec)
    assert counter.counts["kms.CreateKey"] == 0
    assert counter.total <= 6, counter.counts


def test_verify_mode_reports_each_missing_resource(settings, clients):
    verify = Provisioner(clients, settings.with_changes(provisioning="verify"))
    spec = ChannelSpec("shop.audit", namespace=settings.namespace)
    with pytest.raises(ChannelNotFound, match="topic .*shop'"):
        verify.ensure_channel(spec)
    auto = Provisioner(clients, settings)
    auto.ensure_topic(spec.topic_name, {}, {})
    with pytest.raises(ChannelNotFound, match="queue .*-audit' .channel 'shop.audit'"):
        verify.ensure_channel(spec)
    auto.ensure_channel(spec)
    sns = clients.client("sns")
    for subscription in sns.list_subscriptions()["Subscriptions"]:
        sns.unsubscribe(SubscriptionArn=subscription["SubscriptionArn"])
    with pytest.raises(ChannelNotFound, match="subscription of queue"):
        verify.ensure_channel(spec)


def test_offload_bucket_is_encrypted_private_and_expires_payloads(settings, clients):
    name = Provisioner(clients, settings).ensure_bucket()
    s3 = clients.client("s3")
    rule = s3.get_bucket_encryption(Bucket=name)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    block = s3.get_public_access_block(Bucket=name)["PublicAccessBlockConfiguration"]
    assert all(block.values())
    [lifecycle] = s3.get_bucket_lifecycle_configuration(Bucket=name)["Rules"]
    assert lifecycle["Expiration"]["Days"] == 29  # queue + dead-letter copy + a day


def test_the_topic_carries_the_exchanges_tags_whoever_creates_it(settings, clients):
    # A consumer's channel and a producer both provision the exchange's topic: same tags.
    spec = ChannelSpec("shop.audit", namespace=settings.namespace,
                       tags=ChannelTags(owner="alice", critical=True))
    provisioner = Provisioner(clients, settings)
    arn = provisioner.ensure_channel(spec).topic_arn
    assert provisioner.ensure_exchange("shop", ordered=False) == arn
    sns = clients.client("sns")
    tags = {t["Key"]: t["Value"] for t in sns.list_tags_for_resource(ResourceArn=arn)["Tags"]}
    assert tags == exchange_tags("shop", settings.namespace)
    assert tags[TAG_CHANNEL] == "shop" and TAG_OWNER not in tags
