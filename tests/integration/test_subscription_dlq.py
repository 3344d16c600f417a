"""Exchange subscriptions dead-letter to their channel's DLQ instead of dropping what SNS cannot
deliver; the DLQ's policy lets exactly that topic send; the DLQ alarm's scope covers it."""

from __future__ import annotations

import json

from messenger import ChannelSpec
from messenger.channel import ALLOW_TOPIC_DEAD_LETTERS_SID
from messenger.ops.inventory import list_platform_resources
from messenger.ops.queue_alarm import SCOPES
from messenger.provision import Provisioner


def _subscription(clients, resources):
    return clients.client("sns").get_subscription_attributes(
        SubscriptionArn=resources.subscription_arn
    )["Attributes"]


def _dlq_policy(clients, resources):
    attributes = clients.client("sqs").get_queue_attributes(
        QueueUrl=resources.dlq.url, AttributeNames=["Policy"]
    )["Attributes"]
    return json.loads(attributes["Policy"])["Statement"]


def test_every_subscription_dead_letters_to_its_own_channels_dlq(settings, clients):
    # Given an exchange with a plain and a prioritized consumer
    provisioner = Provisioner(clients, settings)
    audit = provisioner.ensure_channel(ChannelSpec("shop.audit", namespace=settings.namespace))
    jobs = provisioner.ensure_channel(
        ChannelSpec("shop.jobs", priorities=("high", "low"), namespace=settings.namespace)
    )
    for resources in (audit, *jobs.levels):
        # Then each subscription's RedrivePolicy names that channel's (level's) own DLQ
        redrive = json.loads(_subscription(clients, resources)["RedrivePolicy"])
        assert redrive == {"deadLetterTargetArn": resources.dlq.arn}
        # And the DLQ lets exactly this topic send, over TLS only
        statements = {s["Sid"]: s for s in _dlq_policy(clients, resources)}
        allow = statements[ALLOW_TOPIC_DEAD_LETTERS_SID]
        assert allow["Effect"] == "Allow"
        assert allow["Principal"] == {"Service": "sns.amazonaws.com"}
        assert allow["Action"] == "sqs:SendMessage"
        assert allow["Resource"] == resources.dlq.arn
        assert allow["Condition"] == {"ArnEquals": {"aws:SourceArn": resources.topic_arn}}
        assert statements["DenyInsecureTransport"]["Effect"] == "Deny"
    # And the DLQ alarm's scope (queues tagged as DLQs) covers every subscription DLQ
    dlq_scope = {q.name for q in list_platform_resources(
        clients, settings.namespace, roles=(SCOPES["dlq"],), resource_types=("sqs",))}
    assert {r.dlq.name for r in (audit, *jobs.levels)} <= dlq_scope


def test_a_single_queue_channels_dlq_admits_no_topic(settings, clients):
    orders = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace)
    )
    assert [s["Sid"] for s in _dlq_policy(clients, orders)] == ["DenyInsecureTransport"]


def test_an_older_subscription_without_a_dlq_gets_one(settings, clients):
    # Given a subscription made before subscription DLQs existed
    spec = ChannelSpec("shop.audit", namespace=settings.namespace)
    provisioner = Provisioner(clients, settings)
    resources = provisioner.ensure_channel(spec)
    sns = clients.client("sns")
    sns.set_subscription_attributes(SubscriptionArn=resources.subscription_arn,
                                    AttributeName="RedrivePolicy", AttributeValue="")
    assert not _subscription(clients, resources).get("RedrivePolicy")
    # When the channel is provisioned again
    again = provisioner.ensure_channel(spec)
    # Then the same subscription has its DLQ
    assert again.subscription_arn == resources.subscription_arn
    redrive = json.loads(_subscription(clients, again)["RedrivePolicy"])
    assert redrive == {"deadLetterTargetArn": resources.dlq.arn}
