"""The workflows table and the grants of results and workflows (issue 52), derived from the specs.

One small app in process (cdk-nag on), synthesized once per session: the platform's foundation
and ops functions, a channel that keeps results consumed by a Lambda consumer (its class from a
code folder written here), a plain channel consumed by another, the HTTP API over both and the
team dashboard. Every wildcard these grants add is the namespace's tags' or a table's indexes
(`test_namespace_grants.py` checks the whole app in three namespaces).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from cdk_nag import AwsSolutionsChecks

from messenger.channel import (
    TAG_MANAGED,
    TAG_NAMESPACE,
    TAG_ROLE,
    ChannelSpec,
    status_table_name,
    workflows_table_name,
)
from messenger.jobs.workflows import OPEN_INDEX
from stacks.channel import Channel
from stacks.dashboard_service import CognitoLogin, DashboardService
from stacks.foundation import WORKFLOWS_OPEN_INDEX, Foundation
from stacks.http_enqueue import JOB_SCHEMA, HttpEnqueue
from stacks.lambda_consumer import LambdaConsumer
from stacks.ops import OpsFunctions
from tests.infra.conftest import ACCOUNT, REGION, as_list
from tests.infra.synthesized import Synthesized, synthesize

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
NAMESPACE = "flows"
CERT = f"arn:aws:acm:{REGION}:{ACCOUNT}:certificate/11111111-2222-3333-4444-555555555555"
CONSUMERS = '''
from messenger import Consumer


class ReportConsumer(Consumer):
    channel = "reports"
    track_status = True
    keep_results = True

    def handler(self, message):
        return {"rows": 3}


class PlainConsumer(Consumer):
    channel = "plain"

    def handler(self, message):
        return None
'''


@pytest.fixture(scope="session")
def app(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    outdir = tmp_path_factory.mktemp("workflow-grants")
    code = tmp_path_factory.mktemp("code") / "flows"  # a team's folder: a package
    code.mkdir()
    (code / "__init__.py").write_text("")
    (code / "consumers.py").write_text(CONSUMERS)
    app = cdk.App(outdir=str(outdir), context=CONTEXT, builtin_cloud_formation_validation=False)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = cdk.Stack(app, "Flows", env=cdk.Environment(account=ACCOUNT, region=REGION))
    foundation = Foundation(stack, "Foundation", namespace=NAMESPACE)
    reports = Channel(stack, "Reports", key=foundation.key, spec=ChannelSpec(
        "reports", namespace=NAMESPACE, track_status=True, keep_results=True,
        visibility_timeout=400))
    plain = Channel(stack, "Plain", key=foundation.key,
                    spec=ChannelSpec("plain", namespace=NAMESPACE, visibility_timeout=400))
    LambdaConsumer(stack, "ReportsConsumer", channel=reports, foundation=foundation, code=code,
                   consumer_class="flows.consumers:ReportConsumer", namespace=NAMESPACE)
    LambdaConsumer(stack, "PlainConsumer", channel=plain, foundation=foundation, code=code,
                   consumer_class="flows.consumers:PlainConsumer", namespace=NAMESPACE)
    HttpEnqueue(stack, "Api", channels=[reports, plain], foundation=foundation,
                namespace=NAMESPACE)
    ops = OpsFunctions(stack, "Ops", namespace=NAMESPACE, slack_webhook_secret="hook",
                       key=foundation.key)
    foundation.grant_workflows_sweep(ops.queue_alarm)  # as PlatformStack does
    DashboardService(
        stack, "Dashboard", foundation=foundation,
        vpc=ec2.Vpc(stack, "Vpc", nat_gateways=0, max_azs=2, flow_logs={
            "all": ec2.FlowLogOptions(destination=ec2.FlowLogDestination.to_cloud_watch_logs(
                logs.LogGroup(stack, "FlowLogs", retention=logs.RetentionDays.ONE_DAY)))}),
        namespace=NAMESPACE,
        certificate=acm.Certificate.from_certificate_arn(stack, "Cert", CERT),
        domain_name="messenger.example.com",
        login=CognitoLogin(domain_prefix="flows-messenger"))
    return synthesize(app, outdir)


def _statements(app: Synthesized, role_part: str) -> list[dict[str, Any]]:
    """The statements of the policies attached to the role whose logical id has `role_part`."""
    roles = [k for k in app.of_type("Flows", "AWS::IAM::Role") if role_part in k]
    assert roles, role_part
    return [s for policy in app.of_type("Flows", "AWS::IAM::Policy").values()
            if any({"Ref": role} in policy["Properties"]["Roles"] for role in roles)
            for s in policy["Properties"]["PolicyDocument"]["Statement"]]


def _on(statements: list[dict[str, Any]], needle: str) -> set[str]:
    """Every action of the statements whose resource mentions `needle`."""
    return {action for s in statements if needle in json.dumps(s["Resource"])
            for action in as_list(s["Action"])}


def _sends_by_tag(statements: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """sqs:SendMessage / sns:Publish statements on any queue or topic: their conditions."""
    return {action: s.get("Condition", {}) for s in statements
            for action in as_list(s["Action"])
            if action in ("sqs:SendMessage", "sns:Publish")
            and json.dumps(s["Resource"]).endswith(':*"]]}')}


def test_no_unacknowledged_nag_findings(app: Synthesized) -> None:
    assert app.violations == []


def test_the_workflows_table_is_the_runtimes(app: Synthesized) -> None:
    # The key schema the runtime makes locally (Workflows.ensure_table): `id` only, and the
    # sparse "open" index (open_shard, created_at) the sweeper queries
    app.template("Flows").has_resource_properties("AWS::DynamoDB::Table", {
        "TableName": workflows_table_name(NAMESPACE),
        "KeySchema": [{"AttributeName": "id", "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [{
            "IndexName": OPEN_INDEX.name,
            "KeySchema": [{"AttributeName": OPEN_INDEX.hash_key, "KeyType": "HASH"},
                          {"AttributeName": OPEN_INDEX.range_key, "KeyType": "RANGE"}],
            "Projection": {"ProjectionType": "ALL"}}],
        "BillingMode": "PAY_PER_REQUEST",
        "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
        "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
        "SSESpecification": {"SSEEnabled": True, "SSEType": "KMS",
                             "KMSMasterKeyId": {"Fn::GetAtt": [
                                 next(k for k in app.of_type("Flows", "AWS::KMS::Key")),
                                 "Arn"]}},
    })
    (table,) = [r for r in app.of_type("Flows", "AWS::DynamoDB::Table").values()
                if r["Properties"]["TableName"] == workflows_table_name(NAMESPACE)]
    assert WORKFLOWS_OPEN_INDEX == OPEN_INDEX.name
    assert {"AttributeName": OPEN_INDEX.hash_key, "AttributeType": OPEN_INDEX.hash_type} in \
        table["Properties"]["AttributeDefinitions"]
    assert {"AttributeName": OPEN_INDEX.range_key, "AttributeType": OPEN_INDEX.range_type} in \
        table["Properties"]["AttributeDefinitions"]
    assert table["DeletionPolicy"] == "Retain"


@pytest.mark.parametrize("role", ["ReportsConsumer", "ApiRole", "OpsQueueAlarm",
                                  "DashboardRole"])
def test_what_runs_workflows_may_hold_and_settle(app: Synthesized, role: str) -> None:
    statements = _statements(app, role)
    # The workflows table, by name
    table = _on(statements, f"table/{workflows_table_name(NAMESPACE)}")
    assert {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"} <= table
    # and only the sweeper queries its open index
    index = _on(statements, f"{workflows_table_name(NAMESPACE)}/index/")
    assert index == ({"dynamodb:Query"} if role == "OpsQueueAlarm" else set())
    # A push with depends_on reads its dependencies' status records (their channel must keep
    # results); the sweeper reads whether a group's member reached its queue
    assert "dynamodb:Query" in _on(statements, "StatusTable")
    # The final outcomes on the status table (ResultStore: finish, add_waiter, get)
    status = _on(statements, "StatusTable")
    assert {"dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:BatchGetItem"} <= status


@pytest.mark.parametrize("role", ["ReportsConsumer", "OpsQueueAlarm", "DashboardRole"])
def test_what_advances_workflows_may_release_a_job_on_any_channel_of_the_namespace(
        app: Synthesized, role: str) -> None:
    # A released job goes to its own channel, any of the namespace's: by the namespace's tags
    sends = _sends_by_tag(_statements(app, role))
    for action, kind in (("sqs:SendMessage", "queue"), ("sns:Publish", "topic")):
        assert sends[action]["StringEquals"] == {
            f"aws:ResourceTag/{TAG_MANAGED}": "true", f"aws:ResourceTag/{TAG_ROLE}": kind,
            f"aws:ResourceTag/{TAG_NAMESPACE}": NAMESPACE}


def test_the_api_releases_only_onto_its_own_channels(app: Synthesized) -> None:
    # It holds the jobs posted to it (on its channels) and releases one there at once when its
    # dependencies are final already: its channels' publish grants, no queue by tag
    assert not _sends_by_tag(_statements(app, "ApiRole"))


def test_a_consumer_of_a_channel_without_results_gets_none_of_it(app: Synthesized) -> None:
    statements = _statements(app, "PlainConsumer")
    assert not _on(statements, workflows_table_name(NAMESPACE))
    assert not _on(statements, "StatusTable")
    assert not _sends_by_tag(statements)
    # and only its own channel's queues: no queue by tag
    assert not any(json.dumps(s["Resource"]).endswith(':*"]]}') for s in statements
                   if any(a.startswith("sqs:") for a in as_list(s["Action"])))


def test_a_large_result_is_an_offloaded_object(app: Synthesized) -> None:
    # The consumer writes it (OffloadStore.put), the API and the dashboard read it
    assert "s3:PutObject" in _on(_statements(app, "ReportsConsumer"), "payloads/*")
    for role in ("ReportsConsumer", "ApiRole", "DashboardRole"):
        assert "s3:GetObject" in _on(_statements(app, role), "payloads/*"), role


def test_the_status_table_grant_names_the_table(app: Synthesized) -> None:
    # (the final items share the status table: IAM tells partitions apart, not sort keys)
    (table,) = [k for k, r in app.of_type("Flows", "AWS::DynamoDB::Table").items()
                if r["Properties"]["TableName"] == status_table_name(NAMESPACE)]
    statements = _statements(app, "ReportsConsumer")
    resources = [s["Resource"] for s in statements if "dynamodb:UpdateItem" in
                 as_list(s["Action"]) and "StatusTable" in json.dumps(s["Resource"])]
    assert resources and all(r == {"Fn::GetAtt": [table, "Arn"]} for r in resources)


def test_the_api_model_takes_depends_on_and_on_dependency_failure() -> None:
    # API Gateway's validator lets them through (the function checks them again, field by field)
    assert JOB_SCHEMA["properties"]["depends_on"] == {"type": "array", "minItems": 1,
                                                      "maxItems": 100}
    assert JOB_SCHEMA["properties"]["on_dependency_failure"]["type"] == "string"


def test_a_teams_producers_attach_one_managed_policy(app: Synthesized) -> None:
    # A producer role outside the app (a team's service) that pushes with depends_on, pushes
    # groups or reads results attaches <ns->messenger-workflow-producers
    (policy,) = [r["Properties"] for r in app.of_type("Flows", "AWS::IAM::ManagedPolicy").values()
                 if r["Properties"].get("ManagedPolicyName")
                 == f"{NAMESPACE}-messenger-workflow-producers"]
    statements = policy["PolicyDocument"]["Statement"]
    assert {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"} <= _on(
        statements, f"table/{workflows_table_name(NAMESPACE)}")
    assert {"dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:Query"} <= _on(
        statements, "StatusTable")
    assert _on(statements, "payloads/*") == {"s3:GetObject"}
    # and nothing of any queue or topic: a job it releases goes to its own channel, which
    # its publish grant names
    assert not [a for s in statements for a in as_list(s["Action"])
                if a.startswith(("sqs:", "sns:"))]
