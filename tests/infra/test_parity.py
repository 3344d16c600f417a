"""Parity: the runtime provisioner, given the same ChannelSpecs, builds what the template declares.

The example channels are provisioned at run time on the moto server (HTTP) in the namespace the
session synth used; queue attributes, redrive, policies, tags, topic attributes and subscription
filter policies are compared with the synthesized template.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from examples.channels import example_channels
from messenger.aws import ClientFactory
from messenger.provision import Provisioner
from messenger.settings import Settings
from tests.infra.conftest import NAMESPACE, REGION, CloudAssembly

#: Queue attributes both sides set (KmsMasterKeyId differs only in form: ARN vs import).
COMPARED_QUEUE_ATTRIBUTES = (
    "DelaySeconds", "MessageRetentionPeriod", "VisibilityTimeout",
    "ReceiveMessageWaitTimeSeconds", "FifoQueue", "ContentBasedDeduplication",
    "KmsDataKeyReusePeriodSeconds",
)
SPECS = example_channels(NAMESPACE)


def _normalized(value: Any) -> str:
    return str(value).lower()


def _statement_shape(statement: dict[str, Any]) -> tuple:
    principal = statement["Principal"]
    if principal == {"AWS": "*"}:
        principal = "*"
    return (
        statement.get("Sid"), statement["Effect"], json.dumps(principal, sort_keys=True),
        json.dumps(statement["Action"]),
        json.dumps({op: sorted(keys) for op, keys in statement.get("Condition", {}).items()},
                   sort_keys=True),
    )


@pytest.fixture(scope="module")
def template_view(assembly: CloudAssembly) -> dict[str, Any]:
    resources = assembly.template("examples")["Resources"]
    queues = {r["Properties"]["QueueName"]: (k, r) for k, r in resources.items()
              if r["Type"] == "AWS::SQS::Queue"}
    policies = {}
    for resource in resources.values():
        if resource["Type"] == "AWS::SQS::QueuePolicy":
            (queue_ref,) = resource["Properties"]["Queues"]
            policies[queue_ref["Ref"]] = resource["Properties"]["PolicyDocument"]
    subscriptions = {}
    for resource in resources.values():
        if resource["Type"] == "AWS::SNS::Subscription":
            subscriptions[resource["Properties"]["Endpoint"]["Fn::GetAtt"][0]] = resource
    topics = {r["Properties"]["TopicName"]: r for r in resources.values()
              if r["Type"] == "AWS::SNS::Topic"}
    return {"queues": queues, "policies": policies, "subscriptions": subscriptions,
            "topics": topics}


@pytest.fixture
def provisioned(endpoint: str) -> tuple[ClientFactory, dict[str, Any]]:
    clients = ClientFactory(REGION)
    provisioner = Provisioner(clients, Settings(namespace=NAMESPACE, region=REGION))
    resources = {}
    for spec in SPECS:
        result = provisioner.ensure_channel(spec)
        for level in result.levels or (result,):
            resources[level.spec.name] = level
    return clients, resources


def test_runtime_queues_equal_the_template(
    provisioned: tuple[ClientFactory, dict[str, Any]], template_view: dict[str, Any]
) -> None:
    clients, resources = provisioned
    sqs = clients.client("sqs")
    assert resources
    for channel in resources.values():
        for ref in (channel.queue, channel.dlq):
            logical_id, declared = template_view["queues"][ref.name]
            runtime = sqs.get_queue_attributes(QueueUrl=ref.url, AttributeNames=["All"])[
                "Attributes"
            ]
            properties = declared["Properties"]
            spec_attributes = (channel.spec.queue_attributes() if ref is channel.queue
                               else channel.spec.dlq_attributes())
            declared_names = set(properties) & set(COMPARED_QUEUE_ATTRIBUTES)
            assert set(spec_attributes) <= declared_names
            for name in declared_names:
                assert _normalized(properties[name]) == _normalized(runtime[name]), (ref.name, name)
            assert runtime["KmsMasterKeyId"].startswith("arn:aws:kms:")
            assert "KmsMasterKeyId" in properties
            if ref is channel.queue:
                redrive = json.loads(runtime["RedrivePolicy"])
                assert redrive["maxReceiveCount"] == properties["RedrivePolicy"]["maxReceiveCount"]
                assert redrive["deadLetterTargetArn"].endswith(f":{channel.dlq.name}")
            else:
                assert "RedrivePolicy" not in runtime and "RedrivePolicy" not in properties
            runtime_policy = json.loads(runtime["Policy"])["Statement"]
            declared_policy = template_view["policies"][logical_id]["Statement"]
            assert [_statement_shape(s) for s in runtime_policy] == [
                _statement_shape(s) for s in declared_policy
            ], ref.name
            runtime_tags = sqs.list_queue_tags(QueueUrl=ref.url).get("Tags", {})
            declared_tags = {t["Key"]: t["Value"] for t in properties["Tags"]}
            assert runtime_tags == {k: v for k, v in declared_tags.items() if k in runtime_tags}
            assert set(runtime_tags) == {k for k in declared_tags if k.startswith("messenger:")}


def test_runtime_topics_and_filter_policies_equal_the_template(
    provisioned: tuple[ClientFactory, dict[str, Any]], template_view: dict[str, Any]
) -> None:
    clients, resources = provisioned
    sns = clients.client("sns")
    exchanges = [c for c in resources.values() if c.topic_arn]
    assert exchanges
    for channel in exchanges:
        declared_topic = template_view["topics"][channel.spec.topic_name]["Properties"]
        topic = sns.get_topic_attributes(TopicArn=channel.topic_arn)["Attributes"]
        for name in ("FifoTopic", "ContentBasedDeduplication"):
            assert _normalized(declared_topic.get(name, "false")) == _normalized(
                topic.get(name, "false")
            ), (channel.spec.topic_name, name)
        logical_id, _ = template_view["queues"][channel.queue.name]
        declared = template_view["subscriptions"][logical_id]["Properties"]
        runtime = sns.get_subscription_attributes(SubscriptionArn=channel.subscription_arn)[
            "Attributes"
        ]
        runtime_policy = json.loads(runtime["FilterPolicy"]) if runtime.get("FilterPolicy") \
            else None
        assert runtime_policy == declared.get("FilterPolicy") == channel.spec.filter_policy()
        assert _normalized(runtime["RawMessageDelivery"]) == _normalized(
            declared["RawMessageDelivery"]
        ) == "true"
        if runtime_policy is not None:
            assert runtime["FilterPolicyScope"] == declared["FilterPolicyScope"]
        # Both dead-letter what SNS cannot deliver to the channel's own DLQ.
        dlq_id, _ = template_view["queues"][channel.dlq.name]
        assert declared["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]}}
        assert json.loads(runtime["RedrivePolicy"]) == {"deadLetterTargetArn": channel.dlq.arn}
