"""Scheduled jobs in the CDK app: recurring schedules and the IAM of one-time ones (one in-process
synthesis of a small app per session: a platform and a channel stack, cdk-nag on)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk import App, Duration
from aws_cdk.assertions import Capture, Match, Template

from messenger.channel import ChannelSpec
from stacks.channel_stack import ChannelStack
from stacks.config import MessengerConfig
from stacks.messenger_app import build_app
from tests.infra.conftest import ACCOUNT, REGION

NAMESPACE = "sched"


def _channels(stack: ChannelStack, namespace: str) -> None:
    reports = stack.add_channel(ChannelSpec("reports", ordered=True))
    stack.add_schedule(reports, "nightly-report", cron="0 3 * * ? *", timezone="Europe/Berlin",
                       body={"kind": "daily"})
    jobs = stack.add_channel(ChannelSpec("sync_jobs", priorities=("high", "low")))
    stack.add_schedule(jobs, "hourly-sync", rate=Duration.hours(1), body={"kind": "sync"})
    stack.add_http_enqueue([jobs])  # its jobs' at / delay_seconds: one-time schedules


@pytest.fixture(scope="session")
def scheduled_app(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Template]:
    app = App(outdir=str(tmp_path_factory.mktemp("sched.out")))
    config = MessengerConfig(namespace=NAMESPACE, account=ACCOUNT, region=REGION,
                             pipeline=False)
    stacks = build_app(app, config, channels=_channels)
    assembly = app.synth()  # cdk-nag runs here: an unacknowledged finding fails it
    assert stacks.examples is not None
    return {name: Template.from_json(assembly.get_stack_by_name(stack.stack_name).template)
            for name, stack in (("platform", stacks.platform), ("channels", stacks.examples))}


def _request(value: Any) -> dict[str, Any]:
    """A target's input as the request it is, each CloudFormation reference as '<Ref:id>'."""
    if isinstance(value, dict) and "Fn::Join" in value:
        value = "".join(part if isinstance(part, str) else
                        "<Ref:{}>".format(json.dumps(part).replace('"', "'"))
                        for part in value["Fn::Join"][1])
    return json.loads(value)


def _schedule(template: Template, name: str) -> dict[str, Any]:
    (found,) = [r["Properties"] for r in template.find_resources(
        "AWS::Scheduler::Schedule").values() if r["Properties"]["Name"] == name]
    return found


def test_a_cron_schedule_per_entry_with_its_timezone_target_and_dlq(scheduled_app):
    channels = scheduled_app["channels"]
    channels.resource_count_is("AWS::Scheduler::Schedule", 2)
    nightly = _schedule(channels, "nightly-report")
    assert nightly["ScheduleExpression"] == "cron(0 3 * * ? *)"
    assert nightly["ScheduleExpressionTimezone"] == "Europe/Berlin"
    assert nightly["GroupName"] == f"{NAMESPACE}-messenger"
    assert nightly["FlexibleTimeWindow"] == {"Mode": "OFF"}
    target = nightly["Target"]
    assert target["Arn"] == "arn:aws:scheduler:::aws-sdk:sqs:sendMessage"
    assert target["RetryPolicy"] == {"MaximumRetryAttempts": 20,
                                     "MaximumEventAgeInSeconds": 86_400}
    assert "ImportValue" in json.dumps(target["DeadLetterConfig"]["Arn"])  # the platform's DLQ
    # The input is the FIFO queue's SendMessage request; the job id is the scheduled time's
    request = _request(target["Input"])
    job_id = "nightly-report@<aws.scheduler.scheduled-time>"
    assert request == {
        "QueueUrl": request["QueueUrl"], "MessageBody": '{"kind":"daily"}',
        "MessageAttributes": {
            "message_id": {"DataType": "String", "StringValue": job_id},
            "meta_headers": {"DataType": "String", "StringValue": json.dumps(
                {"messenger-scheduled": "<aws.scheduler.scheduled-time>"})}},
        "MessageGroupId": "reports", "MessageDeduplicationId": job_id}
    assert request["QueueUrl"].startswith("<Ref:{'Ref': 'ChannelReportsFifoQueue")


def test_a_rate_schedule_sends_to_the_default_level(scheduled_app):
    hourly = _schedule(scheduled_app["channels"], "hourly-sync")
    assert hourly["ScheduleExpression"] == "rate(1 hour)"
    assert hourly["ScheduleExpressionTimezone"] == "UTC"
    request = _request(hourly["Target"]["Input"])
    assert "MessageGroupId" not in request and "MessageDeduplicationId" not in request
    assert request["MessageAttributes"]["message_id"]["StringValue"] == \
        "hourly-sync@<aws.scheduler.scheduled-time>"
    # the default level of ('high', 'low') is the lowest: its queue's URL is in the request
    assert "ChannelSyncJobsLevelLow" in request["QueueUrl"]


def test_each_recurring_schedule_role_reaches_only_its_channel_and_the_dlq(scheduled_app):
    channels = scheduled_app["channels"]
    role = Capture()
    channels.has_resource_properties("AWS::Scheduler::Schedule", {
        "Name": "nightly-report", "Target": Match.object_like({"RoleArn": {
            "Fn::GetAtt": [role, "Arn"]}})})
    roles = channels.find_resources("AWS::IAM::Role")
    trust = roles[role.as_string()]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    (policy,) = [p["Properties"] for p in channels.find_resources("AWS::IAM::Policy").values()
                 if {"Ref": role.as_string()} in p["Properties"]["Roles"]]
    statements = policy["PolicyDocument"]["Statement"]
    resources = json.dumps([s["Resource"] for s in statements])
    assert "*" not in resources.replace("\\\"", "")  # no wildcard anywhere
    sends = [s for s in statements if s["Action"] == "sqs:SendMessage"
             or "sqs:SendMessage" in s["Action"]]
    assert len(sends) == 2  # the channel's queue, and the schedule DLQ
    # Scheduler sends and runs no producer code: no read of the channel's tags
    assert "sqs:ListQueueTags" not in json.dumps(statements)
    assert "ReportsFifo" in json.dumps(sends[0]["Resource"]) or "Reports" in resources
    assert any("kms:GenerateDataKey" in json.dumps(s["Action"]) for s in statements)


def test_the_namespace_has_a_schedule_group_dlq_and_scheduler_role(scheduled_app):
    platform = scheduled_app["platform"]
    platform.has_resource_properties("AWS::Scheduler::ScheduleGroup",
                                     {"Name": f"{NAMESPACE}-messenger"})
    platform.has_resource_properties("AWS::SQS::Queue", {
        "QueueName": f"{NAMESPACE}-messenger-schedules-dlq",
        "KmsMasterKeyId": Match.any_value()})
    platform.has_resource_properties("AWS::IAM::Role", {
        "RoleName": f"{NAMESPACE}-messenger-scheduler",
        "AssumeRolePolicyDocument": Match.object_like({"Statement": [Match.object_like({
            "Principal": {"Service": "scheduler.amazonaws.com"}})]})})


def test_producers_may_create_schedules_in_the_group_and_pass_only_the_scheduler_role(
        scheduled_app):
    platform = scheduled_app["platform"]
    # the producers' policy: the one that creates schedules (the platform's other managed
    # policies are the workflow producers' and the limit operators')
    (policy,) = [p for p in platform.find_resources("AWS::IAM::ManagedPolicy").values()
                 if "scheduler:CreateSchedule" in json.dumps(p["Properties"]["PolicyDocument"])]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    create = next(s for s in statements if "scheduler:CreateSchedule" in s["Action"])
    assert f":schedule/{NAMESPACE}-messenger/*" in json.dumps(create["Resource"])
    (passing,) = [s for s in statements if s["Action"] == "iam:PassRole"]
    assert passing["Condition"] == {
        "StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}}
    role = passing["Resource"]["Fn::GetAtt"][0]
    assert platform.find_resources("AWS::IAM::Role")[role]["Properties"]["RoleName"] == \
        f"{NAMESPACE}-messenger-scheduler"


def test_the_http_apis_function_passes_a_scheduler_role_of_its_own(scheduled_app):
    # Given a channel stack's add_http_enqueue line
    channels = scheduled_app["channels"]
    (function,) = [r for r in channels.find_resources("AWS::Lambda::Function").values()
                   if r["Properties"].get("Handler") == "lambdas.http_enqueue.handler.handler"]
    role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
    # Then its role carries no managed policy: the namespace's producers' policy passes the
    # namespace's scheduler role, which reaches every channel of the namespace
    assert "ManagedPolicyArns" not in channels.find_resources("AWS::IAM::Role")[role_id][
        "Properties"]
    statements = [s for r in channels.find_resources("AWS::IAM::Policy").values()
                  if {"Ref": role_id} in r["Properties"]["Roles"]
                  for s in r["Properties"]["PolicyDocument"]["Statement"]]
    (passing,) = [s for s in statements if s["Action"] == "iam:PassRole"]
    passed = passing["Resource"]["Fn::GetAtt"][0]
    assert function["Properties"]["Environment"]["Variables"][
        "MESSENGER_SCHEDULER_ROLE_ARN"] == {"Fn::GetAtt": [passed, "Arn"]}
    assert "RoleName" not in channels.find_resources("AWS::IAM::Role")[passed]["Properties"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cron": "0 3 * * *"}, "has 5 fields"),
    ({"cron": "0 3 * * ? *", "timezone": "Mars/Olympus"}, "unknown time zone"),
    ({"rate": Duration.seconds(30)}, "whole number of minutes"),
])
def test_a_bad_schedule_fails_synthesis_with_one_clear_error(kwargs, message):
    from messenger.errors import InvalidSettings
    from stacks.platform_stack import PlatformStack

    app = App()
    platform = PlatformStack(app, "P", config=MessengerConfig(namespace="bad"))
    stack = ChannelStack(app, "C", platform=platform)
    channel = stack.add_channel(ChannelSpec("reports"))
    with pytest.raises(InvalidSettings, match=message):
        stack.add_schedule(channel, "nightly", **kwargs)
