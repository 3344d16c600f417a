"""Fine-grained assertions on the templates the real CLI synthesized (one synth per session)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match

from examples.channels import example_channels, wishlist_channels
from messenger.channel import (
    DEFAULT_MAX_RECEIVES,
    TAG_CHANNEL,
    TAG_ROLE,
    dedup_table_name,
    idempotency_table_name,
    status_table_name,
    workers_table_name,
)
from messenger.offload import OFFLOAD_PREFIX, lifecycle_days
from messenger.settings import Settings
from tests.infra.conftest import ACCOUNT, NAMESPACE, REGION, CloudAssembly

SPECS = [level for spec in example_channels(NAMESPACE) for level in spec.level_specs()]


def _by_name(assembly: CloudAssembly, resource_type: str, name_key: str) -> dict[str, dict]:
    return {
        resource["Properties"][name_key]: resource
        for resource in assembly.resources(resource_type, "examples").values()
    }


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in resource["Properties"].get("Tags", [])}


# -- the CLI run -------------------------------------------------------------------------------
def test_synth_reports_no_unacknowledged_nag_findings(assembly: CloudAssembly) -> None:
    report = json.loads((assembly.outdir / "validation-report.json").read_text())
    violations = [
        (plugin["pluginName"], violation["ruleName"])
        for plugin in report["pluginReports"]
        for violation in plugin["violations"]
    ]
    assert violations == []
    assert set(assembly.templates) == {
        f"{NAMESPACE}-MessengerPlatform", f"{NAMESPACE}-MessengerExamples",
        f"{NAMESPACE}-MessengerPipeline",
    }


def test_cfn_lint_passes_on_every_template(assembly: CloudAssembly) -> None:
    templates = sorted(str(p) for p in assembly.outdir.glob("*.template.json"))
    result = subprocess.run(
        # W3005 (DependsOn also implied by a GetAtt) is how the CDK orders a role's policy
        # before the Lambda function or state machine that uses it: harmless and generated.
        # Informational checks too: I3011 flags stateful resources without a DeletionPolicy.
        [str(Path(sys.executable).parent / "cfn-lint"), "--regions", REGION,
         "--ignore-checks", "W3005", "--include-checks", "I", "--", *templates],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_channel_data_is_retained_when_the_stack_goes(assembly: CloudAssembly) -> None:
    # Deleting the stack, or an update that replaces a queue, must not drop its messages
    stateful = {**assembly.resources("AWS::SQS::Queue", "examples"),
                **assembly.resources("AWS::SNS::Topic", "examples")}
    assert len(stateful) == 2 * len(SPECS) + 1  # queues, DLQs, the wishlist exchange topic
    for logical_id, resource in stateful.items():
        assert resource.get("DeletionPolicy") == "Retain", logical_id
        assert resource.get("UpdateReplacePolicy") == "Retain", logical_id


# -- channels ----------------------------------------------------------------------------------
def test_every_queue_and_topic_is_encrypted_with_the_platform_key(assembly: CloudAssembly) -> None:
    queues = assembly.resources("AWS::SQS::Queue", "examples")
    topics = assembly.resources("AWS::SNS::Topic", "examples")
    assert len(queues) == 2 * len(SPECS)
    assert topics
    for resource in [*queues.values(), *topics.values()]:
        key = resource["Properties"]["KmsMasterKeyId"]
        assert "Fn::ImportValue" in key and "FoundationKey" in key["Fn::ImportValue"]
    # The platform's own queues and topic (ops alarms, the ops schedules' dead letters, the
    # scheduled jobs' dead letters) use it too.
    own = [*assembly.resources("AWS::SQS::Queue", "platform").values(),
           *assembly.resources("AWS::SNS::Topic", "platform").values()]
    assert len(own) == 3
    for resource in own:
        key = resource["Properties"]["KmsMasterKeyId"]
        assert "FoundationKey" in key["Fn::GetAtt"][0]
    for resource in queues.values():
        assert resource["Properties"]["KmsDataKeyReusePeriodSeconds"] == 300


def test_every_bucket_is_encrypted_private_and_tls_only(assembly: CloudAssembly) -> None:
    buckets = assembly.resources("AWS::S3::Bucket")
    assert len(buckets) >= 4
    for path, bucket in buckets.items():
        properties = bucket["Properties"]
        rule = properties["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
        assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("aws:kms", "AES256")
        assert properties["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True, "BlockPublicPolicy": True,
            "IgnorePublicAcls": True, "RestrictPublicBuckets": True,
        }, path
    policies = [
        p["Properties"]["PolicyDocument"]["Statement"]
        for p in assembly.resources("AWS::S3::BucketPolicy").values()
    ]
    tls_denials = [
        s for statements in policies for s in statements
        if s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    ]
    assert len(tls_denials) == len(buckets)


def test_offload_bucket_matches_the_runtime(assembly: CloudAssembly) -> None:
    # Given the runtime's defaults for the namespace
    settings = Settings(namespace=NAMESPACE)
    template = assembly.assertions("platform")
    # Then the bucket has the runtime's name, SSE-KMS and the runtime's expiry
    template.has_resource_properties("AWS::S3::Bucket", {
        "BucketName": {"Fn::Join": ["", [
            f"{NAMESPACE}-messenger-offload-", {"Ref": "AWS::AccountId"}, "-",
            {"Ref": "AWS::Region"},
        ]]},
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [{
            "ServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms",
                                              "KMSMasterKeyID": Match.any_value()},
            "BucketKeyEnabled": True,
        }]},
        "LifecycleConfiguration": {"Rules": [Match.object_like({
            "Prefix": OFFLOAD_PREFIX, "Status": "Enabled",
            "ExpirationInDays": lifecycle_days(14 * 86_400),
        })]},
        "LoggingConfiguration": {"DestinationBucketName": Match.any_value(),
                                 "LogFilePrefix": "offload/"},
    })
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})
    template.has_resource_properties("AWS::KMS::Alias", {"AliasName": settings.kms_alias})


def test_status_table_matches_the_runtime(assembly: CloudAssembly) -> None:
    assembly.assertions("platform").has_resource_properties("AWS::DynamoDB::Table", {
        "TableName": status_table_name(NAMESPACE),
        "KeySchema": [{"AttributeName": "message_id", "KeyType": "HASH"},
                      {"AttributeName": "sk", "KeyType": "RANGE"}],
        "BillingMode": "PAY_PER_REQUEST",
        "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
        "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
        "SSESpecification": Match.object_like({"SSEEnabled": True, "SSEType": "KMS"}),
    })


@pytest.mark.parametrize("name, keys", [
    (dedup_table_name, [{"AttributeName": "dedup_key", "KeyType": "HASH"}]),
    (idempotency_table_name, [{"AttributeName": "id", "KeyType": "HASH"}]),
    (workers_table_name, [{"AttributeName": "channel", "KeyType": "HASH"},
                          {"AttributeName": "worker_id", "KeyType": "RANGE"}]),
])
def test_dedup_and_worker_tables_match_the_runtime(assembly: CloudAssembly, name, keys) -> None:
    assembly.assertions("platform").has_resource_properties("AWS::DynamoDB::Table", {
        "TableName": name(NAMESPACE), "KeySchema": keys, "BillingMode": "PAY_PER_REQUEST",
        "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
        "SSESpecification": Match.object_like({"SSEEnabled": True, "SSEType": "KMS"}),
    })


def test_key_policy_lets_sns_deliver_to_encrypted_queues(assembly: CloudAssembly) -> None:
    (key,) = assembly.resources("AWS::KMS::Key", "platform").values()
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    sns = [s for s in statements if s["Principal"] == {"Service": "sns.amazonaws.com"}]
    assert len(sns) == 1
    assert set(sns[0]["Action"]) == {"kms:GenerateDataKey*", "kms:Decrypt"}
    assert sns[0]["Condition"]["StringEquals"]["aws:SourceAccount"] == ACCOUNT


def test_queues_have_runtime_names_attributes_and_redrive(assembly: CloudAssembly) -> None:
    queues = _by_name(assembly, "AWS::SQS::Queue", "QueueName")
    for spec in SPECS:
        queue = queues[spec.queue_name]["Properties"]
        dlq = queues[spec.dlq_name]["Properties"]
        # Then every attribute of the spec is the template's (CloudFormation types).
        for name, value in spec.queue_attributes().items():
            assert str(queue[name]).lower() == value.lower(), (spec.name, name)
        for name, value in spec.dlq_attributes().items():
            assert str(dlq[name]).lower() == value.lower(), (spec.name, name)
        assert queue["RedrivePolicy"]["maxReceiveCount"] == DEFAULT_MAX_RECEIVES == 3
        target = queue["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
        assert queues[spec.dlq_name] is assembly.template("examples")["Resources"][target]
        assert "RedrivePolicy" not in dlq
        assert queue["MessageRetentionPeriod"] == dlq["MessageRetentionPeriod"] == 14 * 86_400
        assert _tags(queues[spec.queue_name])[TAG_ROLE] == "queue"
        assert _tags(queues[spec.dlq_name])[TAG_ROLE] == "dlq"
        assert _tags(queues[spec.queue_name])[TAG_CHANNEL] == spec.name


def test_ordered_channels_are_fifo_pairs(assembly: CloudAssembly) -> None:
    queues = _by_name(assembly, "AWS::SQS::Queue", "QueueName")
    ordered = [spec for spec in SPECS if spec.ordered]
    assert ordered, "the examples include an ordered exchange"
    for spec in SPECS:
        fifo = spec.ordered
        for name in (spec.queue_name, spec.dlq_name):
            assert name.endswith(".fifo") is fifo
            assert queues[name]["Properties"].get("FifoQueue", False) is fifo
    topics = _by_name(assembly, "AWS::SNS::Topic", "TopicName")
    assert topics[ordered[0].topic_name]["Properties"]["FifoTopic"] is True


def test_one_topic_per_exchange_shared_by_its_channels(assembly: CloudAssembly) -> None:
    topics = _by_name(assembly, "AWS::SNS::Topic", "TopicName")
    exchanges = {spec.topic_name for spec in SPECS if spec.topic_name}
    assert set(topics) == exchanges
    (topic_id,) = [k.split("/")[1] for k in assembly.resources("AWS::SNS::Topic", "examples")]
    subscriptions = assembly.resources("AWS::SNS::Subscription")
    assert len(subscriptions) == len(wishlist_channels())
    assert {json.dumps(s["Properties"]["TopicArn"]) for s in subscriptions.values()} == {
        json.dumps({"Ref": topic_id})
    }


def test_subscriptions_carry_the_spec_filter_policy(assembly: CloudAssembly) -> None:
    template = assembly.template("examples")["Resources"]
    by_queue = {}
    for subscription in assembly.resources("AWS::SNS::Subscription").values():
        queue_id = subscription["Properties"]["Endpoint"]["Fn::GetAtt"][0]
        by_queue[template[queue_id]["Properties"]["QueueName"]] = subscription["Properties"]
    for spec in SPECS:
        if spec.exchange is None:
            assert spec.queue_name not in by_queue
            continue
        properties = by_queue[spec.queue_name]
        assert properties["RawMessageDelivery"] is True
        assert properties["Protocol"] == "sqs"
        assert properties.get("FilterPolicy") == spec.filter_policy()
        if spec.filter_policy() is not None:
            assert properties["FilterPolicyScope"] == "MessageAttributes"


def test_queue_policies_are_tls_only_and_admit_only_their_topic(assembly: CloudAssembly) -> None:
    policies = assembly.resources("AWS::SQS::QueuePolicy", "examples")
    assert len(policies) == 2 * len(SPECS)
    for policy in policies.values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        deny = statements[0]
        assert deny["Effect"] == "Deny" and deny["Action"] == "sqs:*"
        assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        for allow in statements[1:]:
            assert allow["Principal"] == {"Service": "sns.amazonaws.com"}
            assert allow["Action"] == "sqs:SendMessage"
            assert "aws:SourceArn" in allow["Condition"]["ArnEquals"]
    for policy in assembly.resources("AWS::SNS::TopicPolicy").values():
        (deny,) = policy["Properties"]["PolicyDocument"]["Statement"]
        assert deny["Effect"] == "Deny"
        assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_the_ops_lambdas_are_watched(assembly: CloudAssembly) -> None:
    """A failing ops Lambda (missing secret, Slack down, timeout) or an undeliverable schedule
    event raises an alarm on the operators' topic instead of failing silently every 15 min."""
    template = assembly.template("platform")
    resources = template["Resources"]
    functions = {
        logical_id: r for logical_id, r in resources.items()
        if r["Type"] == "AWS::Lambda::Function"
        and "lambdas." in r["Properties"].get("Handler", "")
    }
    assert len(functions) == 2
    (topic_id,) = [i for i, r in resources.items() if r["Type"] == "AWS::SNS::Topic"]
    (dlq_id,) = [i for i, r in resources.items() if r["Type"] == "AWS::SQS::Queue"
                 and "/Ops/" in r["Metadata"]["aws:cdk:path"]]
    alarms = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    errors = [a for a in alarms if a["MetricName"] == "Errors"]
    # One error alarm per function: any error in 15 minutes, to the ops topic
    assert sorted(a["Dimensions"][0]["Value"]["Ref"] for a in errors) == sorted(functions)
    for alarm in alarms:
        assert alarm["Threshold"] == 1
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"
        assert alarm["AlarmActions"] == [{"Ref": topic_id}]
    assert all(a["Period"] == 900 and a["Statistic"] == "Sum" for a in errors)
    (undelivered,) = [a for a in alarms if a["MetricName"] == "ApproximateNumberOfMessagesVisible"]
    assert undelivered["Dimensions"][0]["Value"] == {"Fn::GetAtt": [dlq_id, "QueueName"]}
    # Every schedule target retries, then dead-letters the event
    rules = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Events::Rule"]
    assert len(rules) == 3
    for rule in rules:
        (target,) = rule["Targets"]
        assert target["RetryPolicy"] == {"MaximumRetryAttempts": 2,
                                         "MaximumEventAgeInSeconds": 7200}
        assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [dlq_id, "Arn"]}}
    # EventBridge may write to the DLQ; CloudWatch and EventBridge may use the key
    queue_policies = [r["Properties"] for r in resources.values()
                      if r["Type"] == "AWS::SQS::QueuePolicy"
                      and {"Ref": dlq_id} in r["Properties"]["Queues"]]
    statements = [s for p in queue_policies for s in p["PolicyDocument"]["Statement"]]
    assert any(s.get("Principal") == {"Service": "events.amazonaws.com"}
               and s["Effect"] == "Allow" for s in statements)
    tls_only = {"Bool": {"aws:SecureTransport": "false"}}
    assert any(s["Effect"] == "Deny" and s["Condition"] == tls_only for s in statements)
    key_statements = [s for r in resources.values() if r["Type"] == "AWS::KMS::Key"
                      for s in r["Properties"]["KeyPolicy"]["Statement"]]
    principals = {s.get("Principal", {}).get("Service") for s in key_statements}
    assert {"cloudwatch.amazonaws.com", "events.amazonaws.com"} <= principals


def test_no_stack_exports_a_channel(assembly: CloudAssembly) -> None:
    # An export would tie the pipeline to the channel stack: the channel stack could not drop
    # a channel the pipeline imports, so removing one would take two deploys. The pipeline
    # names the topics and queues it publishes to by their deterministic ARNs instead.
    outputs = assembly.template("examples").get("Outputs", {})
    assert not [o for o in outputs.values() if "Export" in o]
    imported = set(_imports(assembly.template("pipeline")))
    assert imported and all(name.startswith(f"{NAMESPACE}-MessengerPlatform:")
                            for name in imported), imported
    (job_policy,) = [p for k, p in assembly.resources("AWS::IAM::Policy", "pipeline").items()
                     if "EmrJobRoleDefaultPolicy" in k]
    statements = job_policy["Properties"]["PolicyDocument"]["Statement"]
    publish: set[str] = set()
    for s in statements:
        if {"sns:Publish", "sqs:SendMessage"} & set(s["Action"]):
            resource = s["Resource"]
            publish.update(resource if isinstance(resource, list) else [resource])
    arn = f"arn:aws:{{}}:{REGION}:{ACCOUNT}:{NAMESPACE}-{{}}"
    # The example exchange and the two example queue channels, each by its deterministic ARN
    assert publish == {arn.format("sns", "wishlist_events.fifo"), arn.format("sqs", "orders"),
                       arn.format("sqs", "order_receipts")}
    # And the channel stack deploys first (a dependency, not an export)
    manifest = json.loads((assembly.outdir / "manifest.json").read_text())
    assert f"{NAMESPACE}-MessengerExamples" in \
        manifest["artifacts"][f"{NAMESPACE}-MessengerPipeline"]["dependencies"]


def _imports(node: Any) -> list[str]:
    if isinstance(node, dict):
        if "Fn::ImportValue" in node:
            return [node["Fn::ImportValue"]]
        return [name for value in node.values() for name in _imports(value)]
    if isinstance(node, list):
        return [name for value in node for name in _imports(value)]
    return []
