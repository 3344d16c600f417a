"""Auto provisioning never takes over a queue another exchange delivers to (moto over HTTP)."""

from __future__ import annotations

import json

import pytest

from messenger import ChannelSpec
from messenger.errors import ProvisioningError
from messenger.provision import Provisioner, source_topics


def _policy(clients, url: str) -> str:
    return clients.client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"]


def test_a_queue_of_another_exchange_is_refused_and_keeps_receiving(settings, clients):
    # Given payment_events.audit_log provisioned: queue '<ns>-audit_log' fed by its topic
    provisioner = Provisioner(clients, settings)
    payments = provisioner.ensure_channel(
        ChannelSpec("payment_events.audit_log", namespace=settings.namespace))
    before = _policy(clients, payments.queue.url)
    # When order_events.audit_log (the same queue name) is provisioned in auto mode
    with pytest.raises(ProvisioningError) as refused:
        provisioner.ensure_channel(
            ChannelSpec("order_events.audit_log", namespace=settings.namespace))
    # Then it is refused, naming the queue, the topic it receives from and the fix (the DLQ,
    # made first, already receives the exchange's undeliverable messages)
    message = str(refused.value)
    assert f"queue '{settings.namespace}-audit_log-dlq' already receives from the topic " \
           f"{payments.topic_arn}" in message
    assert "dead-letter queue of channel 'order_events.audit_log'" in message
    assert "rename the channel" in message
    # And the payments exchange still delivers to it
    assert _policy(clients, payments.queue.url) == before
    assert source_topics(before) == [payments.topic_arn]
    sns, sqs = clients.client("sns"), clients.client("sqs")
    sns.publish(TopicArn=payments.topic_arn, Message=json.dumps({"paid": 1}))
    received = sqs.receive_message(QueueUrl=payments.queue.url, WaitTimeSeconds=2)
    assert [json.loads(m["Body"]) for m in received["Messages"]] == [{"paid": 1}]
    subscriptions = sns.list_subscriptions()["Subscriptions"]
    assert [s["TopicArn"] for s in subscriptions if s["Endpoint"] == payments.queue.arn] == [
        payments.topic_arn
    ]


def test_a_dead_letter_queue_named_like_an_exchange_queue_is_refused(settings, clients):
    # Given the exchange channel events.orders-dlq: queue '<ns>-orders-dlq' fed by 'events'
    provisioner = Provisioner(clients, settings)
    provisioner.ensure_channel(ChannelSpec("events.orders-dlq", namespace=settings.namespace))
    # When the single-consumer channel 'orders' wants '<ns>-orders-dlq' as its DLQ
    with pytest.raises(ProvisioningError, match="as the dead-letter queue of channel 'orders'"):
        provisioner.ensure_channel(ChannelSpec("orders", namespace=settings.namespace))


def test_the_same_channel_provisioned_again_is_not_refused(settings, clients):
    provisioner = Provisioner(clients, settings)
    spec = ChannelSpec("payment_events.audit_log", namespace=settings.namespace,
                       visibility_timeout=60)
    first = provisioner.ensure_channel(spec)
    # A changed attribute goes through the "exists with other attributes" path
    again = provisioner.ensure_channel(
        ChannelSpec("payment_events.audit_log", namespace=settings.namespace,
                    visibility_timeout=120))
    assert again.queue == first.queue and again.topic_arn == first.topic_arn
    attributes = clients.client("sqs").get_queue_attributes(
        QueueUrl=first.queue.url, AttributeNames=["VisibilityTimeout"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "120"
