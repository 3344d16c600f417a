"""`LambdaConsumer`: the example app's Lambda consumer (the session's synthesized app) and small
in-process apps for the synth-time checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match

from examples.cdk import EXAMPLE_CODE, EXAMPLE_CONSUMERS, EXAMPLE_LAMBDA_CONSUMERS
from messenger.channel import ChannelSpec, lambda_consumer_prefix
from stacks.bundle import consumer_lambda_bundle
from stacks.channel import KEY_ACTIONS_CONSUME, QUEUE_ACTIONS_CONSUME, QUEUE_ACTIONS_SEND, Channel
from stacks.foundation import Foundation
from stacks.lambda_consumer import LambdaConsumer
from tests.infra.conftest import ACCOUNT, NAMESPACE, REGION, CloudAssembly, as_list
from tests.infra.test_validation import _app

RECEIPTS = ChannelSpec("order_receipts", namespace=NAMESPACE)


def _of_type(resources: dict[str, Any], kind: str) -> dict[str, Any]:
    return {k: r for k, r in resources.items() if r["Type"] == kind}


def _queue_ids(resources: dict[str, Any]) -> dict[str, str]:
    return {r["Properties"]["QueueName"]: k
            for k, r in _of_type(resources, "AWS::SQS::Queue").items()}


def _role_statements(resources: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    (policy,) = [r for r in _of_type(resources, "AWS::IAM::Policy").values()
                 if {"Ref": role_id} in r["Properties"]["Roles"]]
    return list(policy["Properties"]["PolicyDocument"]["Statement"])


# -- the example app (one CLI synth per session) ---------------------------------------------------
def test_the_example_function_runs_the_class_on_its_queue_with_partial_batch_failures(
    assembly: CloudAssembly,
) -> None:
    template = assembly.assertions("examples")
    resources = assembly.template("examples")["Resources"]
    queue = _queue_ids(resources)[RECEIPTS.queue_name]
    (function_id,) = [k for k, r in _of_type(resources, "AWS::Lambda::Function").items()
                      if "LambdaConsumer" in k]
    template.has_resource_properties("AWS::Lambda::Function", {
        "Handler": "lambdas.consumer.handler.handler",
        "Runtime": "python3.11",
        "Timeout": 23,  # ReceiptsConsumer.processing_timeout 20 s + 3 s to finish
        "Environment": {"Variables": Match.object_like({
            "MESSENGER_CONSUMER": EXAMPLE_LAMBDA_CONSUMERS["order_receipts"],
            "MESSENGER_PROVISIONING": "verify",
            "MESSENGER_NAMESPACE": NAMESPACE,
        })},
    })
    template.has_resource_properties("AWS::Lambda::EventSourceMapping", {
        "EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]},
        "FunctionName": {"Ref": function_id},
        "FunctionResponseTypes": ["ReportBatchItemFailures"],
        "BatchSize": 10,
    })
    # Named in the namespace (the dashboard's pause may update only such functions' mappings)
    name = resources[function_id]["Properties"]["FunctionName"]
    assert name.startswith(lambda_consumer_prefix(NAMESPACE)) and len(name) <= 64, name
    # And AWS's guidance holds: the queue's visibility is at least 6 x the function timeout
    visibility = resources[queue]["Properties"]["VisibilityTimeout"]
    assert visibility >= 6 * resources[function_id]["Properties"]["Timeout"]


#: What `Foundation.grant_cancel_requests` gives both kinds of consumer (read the channel's
#: cancel requests, delete those acted on); a Fargate consumer also writes its registry entry.
CANCEL_REQUEST_ACTIONS = {"dynamodb:DeleteItem", "dynamodb:DescribeTable", "dynamodb:Query"}


def test_the_function_has_a_consumer_services_grants_and_no_more(assembly: CloudAssembly) -> None:
    resources = assembly.template("examples")["Resources"]
    queues = _queue_ids(resources)
    function = next(r for k, r in _of_type(resources, "AWS::Lambda::Function").items()
                    if "LambdaConsumer" in k)
    statements = _role_statements(resources, function["Properties"]["Role"]["Fn::GetAtt"][0])
    by_actions = {tuple(sorted(as_list(s["Action"]))): s["Resource"] for s in statements}
    assert by_actions[tuple(sorted(QUEUE_ACTIONS_CONSUME))] == \
        {"Fn::GetAtt": [queues[RECEIPTS.queue_name], "Arn"]}
    assert by_actions[tuple(sorted(QUEUE_ACTIONS_SEND))] == \
        {"Fn::GetAtt": [queues[RECEIPTS.dlq_name], "Arn"]}
    assert tuple(sorted(KEY_ACTIONS_CONSUME)) in by_actions
    assert "payloads/*" in json.dumps(by_actions[("s3:GetObject",)])
    assert all(s["Resource"] != "*" for s in statements)
    # It reads cancel requests (and deletes those acted on) in the worker registry's table,
    # and writes nothing else there: an invocation registers no entry
    (workers,) = [s for s in statements if "WorkersTable" in json.dumps(s["Resource"])]
    assert set(as_list(workers["Action"])) == CANCEL_REQUEST_ACTIONS
    # The same actions as the Fargate consumer of a queue channel (orders), less ECS task
    # protection and the worker registry entry (a long-running process registers itself for
    # `messenger workers`; an invocation does not), plus writing its own log group
    task = next(t for t in _of_type(resources, "AWS::ECS::TaskDefinition").values()
                if EXAMPLE_CONSUMERS["orders"] in json.dumps(t))
    fargate = _role_statements(resources, task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0])
    def granted(found: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(a, json.dumps(s["Resource"])) for s in found for a in as_list(s["Action"])}

    fargate_workers = {a for a, r in granted(fargate) if "WorkersTable" in r}
    assert fargate_workers == CANCEL_REQUEST_ACTIONS | {"dynamodb:PutItem"}
    assert {a for a, _ in granted(statements)} - {"logs:CreateLogStream", "logs:PutLogEvents"} \
        == {a for a, _ in granted(fargate)} - {"ecs:UpdateTaskProtection"}


def test_errors_throttles_and_queue_age_alarm_to_the_ops_topic(assembly: CloudAssembly) -> None:
    resources = assembly.template("examples")["Resources"]
    alarms = {k: r["Properties"] for k, r in _of_type(resources, "AWS::CloudWatch::Alarm").items()
              if "LambdaConsumer" in k}
    metrics = sorted(a["MetricName"] for a in alarms.values())
    assert metrics == ["ApproximateAgeOfOldestMessage", "Errors", "Throttles"]
    for alarm in alarms.values():
        (action,) = alarm["AlarmActions"]
        assert "Fn::ImportValue" in action and "OpsAlarms" in json.dumps(action)
    (age,) = [a for a in alarms.values() if a["MetricName"] == "ApproximateAgeOfOldestMessage"]
    assert age["Threshold"] == 900 and age["Namespace"] == "AWS/SQS"


def test_the_bundle_imports_the_class_with_its_own_copy_of_the_library() -> None:
    # Given the function's asset, as Lambda unpacks it in /var/task (boto3 is the runtime's)
    bundle = consumer_lambda_bundle(EXAMPLE_CODE)
    script = (
        "import messenger, lambdas.consumer.handler as h\n"
        "from messenger.consume.consumer import load_consumer\n"
        "cls = load_consumer('examples.wishlist:ReceiptsConsumer')\n"
        "print(messenger.__file__, cls.channel)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(bundle)}
    result = subprocess.run([sys.executable, "-c", script], cwd="/", env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    path, channel = result.stdout.split()
    assert path.startswith(str(bundle)) and channel == "order_receipts"


# -- synth-time checks (small apps in process) ---------------------------------------------------
def _lambda_stack(outdir: Path, spec: ChannelSpec, consumer_class: str,
                  code: Path = EXAMPLE_CODE, **options: Any) -> cdk.App:
    app = _app(outdir)
    stack = cdk.Stack(app, "Small", env=cdk.Environment(account=ACCOUNT, region=REGION))
    foundation = Foundation(stack, "Foundation", namespace="")
    channel = Channel(stack, "Channel", spec=spec, key=foundation.key)
    LambdaConsumer(stack, "Consumer", channel=channel, foundation=foundation, code=code,
                   consumer_class=consumer_class, namespace="", **options)
    return app


def test_a_visibility_below_six_function_timeouts_fails_synthesis(tmp_path: Path) -> None:
    # Given the orders channel (visibility 60 s) consumed by a 33 s function
    app = _lambda_stack(tmp_path, ChannelSpec("orders"), "examples.wishlist:OrdersConsumer")
    with pytest.raises(Exception) as failure:
        app.synth()
    message = str(failure.value)
    assert "Small/Consumer" in message
    assert "visibility_timeout (60 s) is less than 6 x the function timeout (33 s)" in message
    assert "Raise ChannelSpec.visibility_timeout to at least 198" in message


def test_a_timeout_shorter_than_processing_plus_finishing_fails_synthesis(tmp_path: Path) -> None:
    app = _lambda_stack(tmp_path, ChannelSpec("order_receipts", visibility_timeout=150),
                        "examples.wishlist:ReceiptsConsumer", timeout=cdk.Duration.seconds(20))
    with pytest.raises(Exception, match=r"the function timeout \(20 s\) must be from "
                                        r"processing_timeout \+ 3 s \(23 s"):
        app.synth()


def test_a_class_of_another_channel_fails_synthesis_as_for_fargate(tmp_path: Path) -> None:
    app = _lambda_stack(tmp_path, ChannelSpec("order_receipts", visibility_timeout=150),
                        "examples.wishlist:OrdersConsumer", timeout=cdk.Duration.seconds(25))
    with pytest.raises(Exception, match="declares channel='orders' but is deployed for channel "
                                        "'order_receipts'"):
        app.synth()


def test_each_priority_level_gets_its_event_source(tmp_path: Path) -> None:
    # Given a team's folder with a prioritized consumer
    code = tmp_path / "team"
    code.mkdir()
    (code / "jobs.py").write_text(
        "from messenger import Consumer\n"
        "class Jobs(Consumer):\n"
        "    channel = 'jobs'\n"
        "    priorities = ('high', 'low')\n"
        "    visibility_timeout = 400\n"
        "    def handler(self, message): pass\n"
    )
    spec = ChannelSpec("jobs", visibility_timeout=400, priorities=("high", "low"))
    app = _lambda_stack(tmp_path / "out", spec, "team.jobs:Jobs", code=code, max_concurrency=5,
                        batch_size=100, max_batching_window=cdk.Duration.seconds(2))
    # When synthesized
    resources = app.synth().get_stack_by_name("Small").template["Resources"]
    # Then Lambda polls every level's queue, with the options given
    queues = _queue_ids(resources)
    mappings = [r["Properties"] for r in
                _of_type(resources, "AWS::Lambda::EventSourceMapping").values()]
    assert sorted(m["EventSourceArn"]["Fn::GetAtt"][0] for m in mappings) == sorted(
        queues[level.queue_name] for level in spec.level_specs())
    assert {(m["BatchSize"], m["MaximumBatchingWindowInSeconds"],
             m["ScalingConfig"]["MaximumConcurrency"]) for m in mappings} == {(100, 2, 5)}


@pytest.mark.parametrize(("spec", "options", "error"), [
    (ChannelSpec("q", ordered=True), {"batch_size": 11}, "batch_size must be from 1 to 10 on an "
                                                         "ordered channel"),
    (ChannelSpec("q", ordered=True), {"max_batching_window": cdk.Duration.seconds(1)},
     "max_batching_window is not available on an ordered channel"),
    (ChannelSpec("q"), {"batch_size": 50}, "batch_size 50 needs a max_batching_window"),
    (ChannelSpec("q"), {"max_concurrency": 1}, "max_concurrency must be from 2 to 1000"),
])
def test_event_source_options_are_checked_with_the_field_named(
    tmp_path: Path, spec: ChannelSpec, options: dict[str, Any], error: str,
) -> None:
    with pytest.raises(ValueError, match=error):
        _lambda_stack(tmp_path, spec, "examples.wishlist:ReceiptsConsumer", **options)


def test_code_with_requirements_needs_layers(tmp_path: Path) -> None:
    code = tmp_path / "team"
    code.mkdir()
    (code / "requirements.txt").write_text("# pinned\nrequests==2.32.3\n")
    with pytest.raises(ValueError, match=r"requirements.txt lists packages, which a Lambda "
                                         r"bundle does not install; give layers="):
        _lambda_stack(tmp_path / "out", ChannelSpec("q"), "team.jobs:Jobs", code=code)
