"""Every exchange subscription in the synthesized templates dead-letters to its channel's DLQ, and
that DLQ's policy lets the subscription's topic (and nothing else) send to it."""

from __future__ import annotations

from typing import Any

from examples.channels import example_channels
from messenger.channel import ALLOW_TOPIC_DEAD_LETTERS_SID, TAG_ROLE
from tests.infra.conftest import NAMESPACE, CloudAssembly


def _policies_by_queue(resources: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    found = {}
    for logical_id, resource in resources.items():
        if resource["Type"] == "AWS::SQS::QueuePolicy":
            (queue_ref,) = resource["Properties"]["Queues"]
            found[queue_ref["Ref"]] = (logical_id, resource["Properties"]["PolicyDocument"])
    return found


def test_every_subscription_has_its_channels_dlq_as_redrive_target(
    assembly: CloudAssembly,
) -> None:
    checked = 0
    for stack, template in assembly.templates.items():
        resources = template["Resources"]
        policies = _policies_by_queue(resources)
        for logical_id, subscription in resources.items():
            if subscription["Type"] != "AWS::SNS::Subscription":
                continue
            properties = subscription["Properties"]
            queue_id = properties["Endpoint"]["Fn::GetAtt"][0]
            dlq_id = properties["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"]
            assert dlq_id[1] == "Arn", (stack, logical_id)
            dlq = resources[dlq_id[0]]
            # The target is the DLQ the subscribed queue redrives to: one DLQ per channel
            queue = resources[queue_id]["Properties"]
            assert queue["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0] == dlq_id[0]
            tags = {t["Key"]: t["Value"] for t in dlq["Properties"]["Tags"]}
            assert tags[TAG_ROLE] == "dlq"  # in the DLQ alarm's scope
            assert bool(dlq["Properties"].get("FifoQueue")) == bool(
                queue.get("FifoQueue")
            )  # SNS requires a FIFO DLQ for a FIFO topic
            # The DLQ's policy lets the subscription's topic send, and only over TLS
            policy_id, document = policies[dlq_id[0]]
            statements = {s.get("Sid"): s for s in document["Statement"]}
            allow = statements[ALLOW_TOPIC_DEAD_LETTERS_SID]
            assert allow["Effect"] == "Allow"
            assert allow["Principal"] == {"Service": "sns.amazonaws.com"}
            assert allow["Action"] == "sqs:SendMessage"
            assert allow["Resource"] == {"Fn::GetAtt": [dlq_id[0], "Arn"]}
            assert allow["Condition"] == {"ArnEquals": {"aws:SourceArn": properties["TopicArn"]}}
            assert statements["DenyInsecureTransport"]["Effect"] == "Deny"
            # The subscription is created only once SNS may write to the DLQ
            assert policy_id in subscription["DependsOn"], (stack, logical_id)
            checked += 1
    # One per exchange channel (per priority level) of the examples and the platform
    expected = [level for spec in example_channels(NAMESPACE) for level in spec.level_specs()
                if level.exchange]
    assert expected and checked >= len(expected)


def test_a_single_queue_channels_dlq_admits_no_topic(assembly: CloudAssembly) -> None:
    resources = assembly.template("examples")["Resources"]
    subscribed = {
        r["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
        for r in resources.values() if r["Type"] == "AWS::SNS::Subscription"
    }
    policies = _policies_by_queue(resources)
    others = [
        logical_id for logical_id, r in resources.items()
        if r["Type"] == "AWS::SQS::Queue" and "RedrivePolicy" not in r["Properties"]
        and logical_id not in subscribed
    ]
    assert others
    for logical_id in others:
        _, document = policies[logical_id]
        assert [s.get("Sid") for s in document["Statement"]] == ["DenyInsecureTransport"]
