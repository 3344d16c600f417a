"""In-process synthesis of small apps: validation errors, priority levels, acknowledgements."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs

import stacks.nag
from examples.cdk import add_example_channels
from messenger.channel import (
    ChannelSpec,
    MessageFilter,
    idempotency_table_name,
    workers_table_name,
)
from stacks.channel import Channel
from stacks.config import MessengerConfig
from stacks.consumer_scaling import BacklogPerTask, FargateCapacity, StepScaling
from stacks.consumer_service import ConsumerService
from stacks.foundation import Foundation
from stacks.messenger_app import build_app
from tests.infra.conftest import ACCOUNT, REGION

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]


def _app(outdir: Path) -> cdk.App:
    return cdk.App(outdir=str(outdir), context=CONTEXT, builtin_cloud_formation_validation=False)


#: What the platform's cluster offers (Container Insights, the Fargate capacity providers).
PLATFORM_CLUSTER = {"container_insights_v2": ecs.ContainerInsights.ENABLED,
                    "enable_fargate_capacity_providers": True}


def _consumer_stack(
    outdir: Path, spec: ChannelSpec, cluster_options: dict[str, Any] | None = None,
    **options: Any
) -> tuple[cdk.App, Channel]:
    cluster_options = PLATFORM_CLUSTER if cluster_options is None else cluster_options
    app = _app(outdir)
    stack = cdk.Stack(app, "Small", env=cdk.Environment(account=ACCOUNT, region=REGION))
    foundation = Foundation(stack, "Foundation", namespace=spec.namespace)
    channel = Channel(stack, "Channel", spec=spec, key=foundation.key)
    cluster = ecs.Cluster(stack, "Cluster", vpc=ec2.Vpc(stack, "Vpc", nat_gateways=0,
                                                          availability_zones=["eu-west-1a"]),
                          **cluster_options)
    ConsumerService(
        stack, "Consumer", channel=channel, foundation=foundation, cluster=cluster,
        image=ecs.ContainerImage.from_registry("public.ecr.aws/docker/library/python:3.11"),
        consumer_class="examples.wishlist:AllEventsConsumer", namespace=spec.namespace,
        **options,
    )
    return app, channel


def test_visibility_timeout_shorter_than_processing_fails_synthesis(tmp_path: Path) -> None:
    # Given a channel whose messages become visible again after 30 s
    app, _ = _consumer_stack(tmp_path, ChannelSpec("orders", visibility_timeout=30),
                             processing_timeout=cdk.Duration.seconds(60))
    # When the consumer may process one for 60 s, Then synthesis fails and says what to raise
    with pytest.raises(Exception) as failure:
        app.synth()
    message = str(failure.value)
    assert "Small/Consumer" in message
    assert "visibility_timeout (30 s) is shorter than the consumer's processing_timeout (60 s)" \
        in message
    assert "Raise ChannelSpec.visibility_timeout to at least 60" in message


def test_fifo_queue_with_a_standard_dead_letter_queue_fails_synthesis(tmp_path: Path) -> None:
    # Given an ordered channel whose DLQ was made standard through the L1 escape hatch
    app, channel = _consumer_stack(tmp_path, ChannelSpec("orders", ordered=True))
    channel.dlq_resource.fifo_queue = False
    with pytest.raises(Exception) as failure:
        app.synth()
    message = str(failure.value)
    assert "the FIFO queue 'orders.fifo' has a standard dead-letter queue" in message
    assert "both to be FIFO or both standard" in message


def test_stop_timeout_must_exceed_the_shutdown_timeout(tmp_path: Path) -> None:
    app, _ = _consumer_stack(tmp_path, ChannelSpec("orders"),
                             shutdown_timeout=cdk.Duration.seconds(60),
                             stop_timeout=cdk.Duration.seconds(60))
    with pytest.raises(Exception, match=r"stop_timeout \(60 s\) must be above shutdown_timeout"):
        app.synth()


def test_consumer_class_must_be_a_module_path(tmp_path: Path) -> None:
    app = _app(tmp_path)
    stack = cdk.Stack(app, "Bad")
    foundation = Foundation(stack, "Foundation", namespace="")
    channel = Channel(stack, "Channel", spec=ChannelSpec("orders"), key=foundation.key)
    cluster = ecs.Cluster(stack, "Cluster", vpc=ec2.Vpc(stack, "Vpc", nat_gateways=0))
    with pytest.raises(ValueError, match="consumer_class must be 'package.module:Class'"):
        ConsumerService(
            stack, "Consumer", channel=channel, foundation=foundation, cluster=cluster,
            image=ecs.ContainerImage.from_registry("python"),
            consumer_class="examples.wishlist", namespace="",
        )


def test_priority_levels_get_their_own_queues_and_filters(tmp_path: Path) -> None:
    # Given a prioritized exchange channel and a consumer of it
    spec = ChannelSpec("jobs.worker", priorities=("high", "default", "low"), namespace="p",
                       message_filter=MessageFilter("prefix", ["JOB."]), track_status=True)
    app, channel = _consumer_stack(tmp_path, spec)
    # When synthesized
    template = app.synth().get_stack_by_name("Small").template
    resources = template["Resources"].values()
    queues = {r["Properties"]["QueueName"] for r in resources if r["Type"] == "AWS::SQS::Queue"}
    # Then every level has a queue and a DLQ named like the runtime's
    levels = spec.level_specs()
    assert queues == {name for level in levels for name in (level.queue_name, level.dlq_name)}
    policies = [r["Properties"]["FilterPolicy"] for r in resources
                if r["Type"] == "AWS::SNS::Subscription"]
    assert sorted(map(json.dumps, policies)) == sorted(
        json.dumps(level.filter_policy()) for level in levels
    )
    # And the consumer reads every level
    (task_policy,) = [r for r in resources if r["Type"] == "AWS::IAM::Policy"
                      and "sqs:ReceiveMessage" in json.dumps(r)]
    receive = [s for s in task_policy["Properties"]["PolicyDocument"]["Statement"]
               if "sqs:ReceiveMessage" in s["Action"]]
    assert len(receive[0]["Resource"]) == len(levels)
    # And, tracking status, may write to the status table
    statements = task_policy["Properties"]["PolicyDocument"]["Statement"]
    status = [s for s in statements if "dynamodb:BatchWriteItem" in s["Action"]]
    assert len(status) == 1
    # And registers its processes in the worker registry (write and delete its entry) and reads
    # its channel's cancel requests there (Query), nothing more
    (workers,) = [s for s in statements if "dynamodb:DeleteItem" in s["Action"]
                  and "Condition" not in s]  # (the other: claims of fired jobs, a prefix)
    assert sorted(workers["Action"]) == ["dynamodb:DeleteItem", "dynamodb:DescribeTable",
                                         "dynamodb:PutItem", "dynamodb:Query"]
    tables = {key: r["Properties"]["TableName"] for key, r in template["Resources"].items()
              if r["Type"] == "AWS::DynamoDB::Table"}
    (table_id,) = [key for key, name in tables.items() if name == workers_table_name("p")]
    assert json.dumps(workers["Resource"]).count(table_id) == 1


def test_every_acknowledgement_answers_a_real_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the whole app with the acknowledgements recorded instead of applied
    recorded: list[tuple[str, str]] = []

    class Recorder:
        def __init__(self, scope: Any) -> None:
            self.path = scope.node.path

        def acknowledge(self, acknowledgment: cdk.Acknowledgment) -> None:
            recorded.append((self.path, acknowledgment.id))

    class RecordingValidations:
        of = Recorder

    monkeypatch.setattr(stacks.nag, "Validations", RecordingValidations)
    app = _app(tmp_path)
    build_app(
        app, MessengerConfig(namespace="nag", account=ACCOUNT, region=REGION),
        channels=add_example_channels,
    )
    # When synthesized, cdk-nag reports every finding
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    findings = {
        (construct["constructPath"], violation["ruleName"])
        for plugin in report["pluginReports"]
        for violation in plugin["violations"]
        for construct in violation["violatingConstructs"]
    }
    # Then each acknowledgement covers at least one finding, and every finding is acknowledged
    assert recorded
    for path, rule in recorded:
        assert any(f_rule == rule and f_path.startswith(path) for f_path, f_rule in findings), \
            (path, rule)
    for path, rule in findings:
        assert any(rule == a_rule and path.startswith(a_path) for a_path, a_rule in recorded), \
            (path, rule)


def test_an_exchange_spanning_two_stacks_has_one_topic(tmp_path: Path) -> None:
    # Given two stacks with channels of the same exchange
    app = _app(tmp_path)
    env = cdk.Environment(account=ACCOUNT, region=REGION)
    first = cdk.Stack(app, "First", env=env)
    second = cdk.Stack(app, "Second", env=env)
    foundation = Foundation(first, "Foundation", namespace="x")
    Channel(first, "A", spec=ChannelSpec("events.a", namespace="x"), key=foundation.key)
    Channel(second, "B", spec=ChannelSpec("events.b", namespace="x"), key=foundation.key)
    # When synthesized
    assembly = app.synth()
    topics = [
        resource
        for name in ("First", "Second")
        for resource in assembly.get_stack_by_name(name).template["Resources"].values()
        if resource["Type"] == "AWS::SNS::Topic"
    ]
    # Then there is one topic, and the second stack's queue subscribes to it
    assert [t["Properties"]["TopicName"] for t in topics] == ["x-events"]
    (subscription,) = [
        r for r in assembly.get_stack_by_name("Second").template["Resources"].values()
        if r["Type"] == "AWS::SNS::Subscription"
    ]
    # by the topic's deterministic ARN: no export ties the stacks, the first deploys first
    assert subscription["Properties"]["TopicArn"] == f"arn:aws:sns:{REGION}:{ACCOUNT}:x-events"
    second = assembly.get_stack_by_name("Second")
    assert [d.id for d in second.dependencies if d.id != "Second.assets"] == ["First"]
    first = assembly.get_stack_by_name("First").template
    (topic_id,) = [k for k, r in first["Resources"].items() if r["Type"] == "AWS::SNS::Topic"]
    assert topic_id not in json.dumps(first.get("Outputs", {}))


def test_a_throwaway_stage_may_opt_out_of_retained_channels(tmp_path: Path) -> None:
    # Given a channel built with the documented switch
    app = _app(tmp_path)
    stack = cdk.Stack(app, "Scratch", env=cdk.Environment(account=ACCOUNT, region=REGION))
    foundation = Foundation(stack, "Foundation", namespace="dev")
    Channel(stack, "Channel", spec=ChannelSpec("events.audit", namespace="dev"),
            key=foundation.key, removal_policy=cdk.RemovalPolicy.DESTROY)
    # When synthesized
    resources = app.synth().get_stack_by_name("Scratch").template["Resources"].values()
    stateful = [r for r in resources if r["Type"] in ("AWS::SQS::Queue", "AWS::SNS::Topic")]
    # Then its queue, DLQ and topic are deleted with the stack
    assert len(stateful) == 3
    assert {(r["DeletionPolicy"], r["UpdateReplacePolicy"]) for r in stateful} == {
        ("Delete", "Delete")
    }


@pytest.mark.parametrize(("options", "message"), [
    ({"capacity": "spots"},
     "capacity must be one of on-demand, spot or a FargateCapacity, got 'spots'"),
    ({"min_tasks": 0},
     "min_tasks must be >= 1 with BacklogPerTask scaling, got 0"),
    ({"scaling": BacklogPerTask(average_processing_time=cdk.Duration.seconds(0))},
     "BacklogPerTask average_processing_time and acceptable_latency must be > 0 s"),
    ({"scaling": BacklogPerTask(scale_in_percent=80)},
     "BacklogPerTask scale_in_percent must be from 1 to 50, got 80"),
    ({"capacity": FargateCapacity(on_demand_weight=0, spot_weight=0)},
     "FargateCapacity on_demand_weight and spot_weight are both 0"),
    ({"min_tasks": 3, "max_tasks": 2}, "need 0 <= min_tasks <= max_tasks, got 3 and 2"),
])
def test_scaling_and_capacity_settings_are_checked(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        _consumer_stack(tmp_path, ChannelSpec("orders"), **options)


def test_step_scaling_may_scale_to_zero_tasks(tmp_path: Path) -> None:
    app, _ = _consumer_stack(tmp_path, ChannelSpec("orders"), min_tasks=0,
                             scaling=StepScaling())
    template = app.synth().get_stack_by_name("Small").template
    (target,) = [r["Properties"] for r in template["Resources"].values()
                 if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"]
    assert target["MinCapacity"] == 0


def test_the_backlog_target_follows_latency_processing_time_and_concurrency() -> None:
    # 5 minutes accepted, 2 s a message, 4 in parallel per task: 600 messages per task
    scaling = BacklogPerTask(average_processing_time=cdk.Duration.seconds(2),
                             acceptable_latency=cdk.Duration.minutes(5))
    assert scaling.target_value(concurrency=4) == 600
    assert BacklogPerTask(target=42).target_value(concurrency=4) == 42
    assert FargateCapacity.of("on-demand").strategies() is None  # keeps LaunchType FARGATE


@pytest.mark.parametrize(("cluster_options", "options", "message"), [
    ({}, {}, "has Container Insights off, and BacklogPerTask scaling divides by its "
             "RunningTaskCount"),
    ({"container_insights_v2": ecs.ContainerInsights.ENABLED}, {"capacity": "spot"},
     "does not offer the capacity providers FARGATE_SPOT: create it with "
     "enable_fargate_capacity_providers=True"),
])
def test_the_cluster_must_offer_what_scaling_and_capacity_need(
    tmp_path: Path, cluster_options: dict[str, Any], options: dict[str, Any], message: str
) -> None:
    app, _ = _consumer_stack(tmp_path, ChannelSpec("orders"), cluster_options, **options)
    with pytest.raises(Exception, match=re.escape(message)):
        app.synth()


@pytest.mark.parametrize("idempotent", [False, True])
def test_an_idempotent_consumer_may_use_the_idempotency_table_only(
        tmp_path: Path, idempotent: bool) -> None:
    # Given a consumer service declared idempotent (or not)
    app, _ = _consumer_stack(tmp_path, ChannelSpec("orders", namespace="p"),
                             idempotent=idempotent)
    template = app.synth().get_stack_by_name("Small").template
    tables = {key: r["Properties"]["TableName"] for key, r in template["Resources"].items()
              if r["Type"] == "AWS::DynamoDB::Table"}
    (table_id,) = [key for key, name in tables.items() if name == idempotency_table_name("p")]
    statements = [s for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                  for s in r["Properties"]["PolicyDocument"]["Statement"]]
    granted = [s for s in statements if table_id in json.dumps(s["Resource"])]
    # Then only the idempotent one may use the table: Powertools' four calls on it alone
    if not idempotent:
        assert granted == []
        return
    (grant,) = granted
    assert sorted(grant["Action"]) == ["dynamodb:DeleteItem", "dynamodb:DescribeTable",
                                       "dynamodb:GetItem", "dynamodb:PutItem",
                                       "dynamodb:UpdateItem"]
    assert json.dumps(grant["Resource"]).count(table_id) == 1
