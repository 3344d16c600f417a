"""`DashboardService` (stacks/dashboard_service.py) through `PlatformStack.add_dashboard`: one
in-process synth per session of two platforms, one signing in with a Cognito pool the construct
creates, one with a team's OIDC provider; cdk-nag on. HTTPS only, the authenticate action before
the forward and no rule around it, a function only the load balancer may invoke, and a role that
reads the namespace and writes only what operators do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_certificatemanager as acm
from aws_cdk.assertions import Match
from cdk_nag import AwsSolutionsChecks

from messenger.jobs.controls import PAUSE_PARTITION
from stacks.config import MessengerConfig
from stacks.dashboard_service import PAUSE_RECORDS_PARTITION, CognitoLogin, OidcLogin
from stacks.platform_stack import PlatformStack
from tests.infra.conftest import ACCOUNT, REGION
from tests.infra.synthesized import Synthesized, synthesize

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
CERT = f"arn:aws:acm:{REGION}:{ACCOUNT}:certificate/11111111-2222-3333-4444-555555555555"


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    outdir = tmp_path_factory.mktemp("dashboard-service")
    app = cdk.App(outdir=str(outdir), context=CONTEXT, builtin_cloud_formation_validation=False)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    env = cdk.Environment(account=ACCOUNT, region=REGION)
    for name, login in (
        ("dcog", CognitoLogin(domain_prefix="dcog-messenger")),
        ("doidc", OidcLogin(
            issuer="https://idp.example", authorization_endpoint="https://idp.example/auth",
            token_endpoint="https://idp.example/token",
            user_info_endpoint="https://idp.example/userinfo", client_id="dashboard",
            client_secret=cdk.SecretValue.secrets_manager("messenger/dashboard-oidc"))),
    ):
        platform = PlatformStack(app, name, config=MessengerConfig(namespace=name), env=env)
        platform.add_dashboard(
            certificate=acm.Certificate.from_certificate_arn(platform, "Cert", CERT),
            domain_name=f"{name}.example.com", login=login, operator_groups=["ops", "admins"])
    return synthesize(app, outdir)


STACKS = ("dcog", "doidc")


def test_both_synthesize_cdk_nag_clean(synthesized: Synthesized) -> None:
    assert synthesized.violations == []
    assert set(synthesized.templates) == set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_https_only_and_every_request_authenticated_before_the_forward(
        synthesized: Synthesized, stack: str) -> None:
    listeners = synthesized.of_type(stack, "AWS::ElasticLoadBalancingV2::Listener")
    by_port = {r["Properties"]["Port"]: r["Properties"] for r in listeners.values()}
    assert set(by_port) == {443, 80}
    https, http = by_port[443], by_port[80]
    assert https["Protocol"] == "HTTPS" and https["Certificates"] == [{"CertificateArn": CERT}]
    assert https["SslPolicy"].startswith("ELBSecurityPolicy-TLS13")
    # Port 80 only redirects to HTTPS
    assert http["DefaultActions"] == [{"Type": "redirect", "RedirectConfig": {
        "Protocol": "HTTPS", "Port": "443", "StatusCode": "HTTP_301"}}]
    # HTTPS: authenticate first, then forward; nothing else
    kinds = [(a["Order"], a["Type"]) for a in https["DefaultActions"]]
    expected = "authenticate-cognito" if stack == "dcog" else "authenticate-oidc"
    assert kinds == [(1, expected), (2, "forward")]
    config = https["DefaultActions"][0][
        "AuthenticateCognitoConfig" if stack == "dcog" else "AuthenticateOidcConfig"]
    assert config["OnUnauthenticatedRequest"] == "authenticate"
    # No listener rule anywhere: no path around the login
    assert synthesized.of_type(stack, "AWS::ElasticLoadBalancingV2::ListenerRule") == {}
    # The load balancer drops malformed headers and logs every request
    (alb,) = synthesized.of_type(stack, "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
    attributes = {a["Key"]: a["Value"] for a in alb["Properties"]["LoadBalancerAttributes"]}
    assert attributes["routing.http.drop_invalid_header_fields.enabled"] == "true"
    assert attributes["access_logs.s3.enabled"] == "true"


@pytest.mark.parametrize("stack", STACKS)
def test_only_the_load_balancer_invokes_the_function(synthesized: Synthesized,
                                                     stack: str) -> None:
    assert synthesized.of_type(stack, "AWS::Lambda::Url") == {}
    (permission,) = [p["Properties"] for p in
                     synthesized.of_type(stack, "AWS::Lambda::Permission").values()
                     if p["Properties"]["Principal"] == "elasticloadbalancing.amazonaws.com"]
    # ... of this account only (and the app checks the header's signer: this very ALB)
    assert permission["SourceAccount"] == ACCOUNT
    dashboard = [p for p in synthesized.of_type(stack, "AWS::Lambda::Permission").values()
                 if "DashboardFunction" in json.dumps(p["Properties"]["FunctionName"])]
    assert len(dashboard) == 1
    # The function knows which load balancer and app client sign its header
    (function,) = [f["Properties"] for f in synthesized.of_type(
        stack, "AWS::Lambda::Function").values()
        if "MESSENGER_DASHBOARD_ALB_ARN" in f["Properties"].get("Environment", {}).get(
            "Variables", {})]
    variables = function["Environment"]["Variables"]
    (alb,) = synthesized.of_type(stack, "AWS::ElasticLoadBalancingV2::LoadBalancer")
    assert variables["MESSENGER_DASHBOARD_ALB_ARN"] == {"Ref": alb}
    assert variables["MESSENGER_DASHBOARD_OPERATOR_GROUPS"] == "ops,admins"
    if stack == "dcog":
        (client,) = synthesized.of_type(stack, "AWS::Cognito::UserPoolClient")
        assert variables["MESSENGER_DASHBOARD_CLIENT_ID"] == {"Ref": client}
        assert variables["MESSENGER_DASHBOARD_GROUPS_CLAIM"] == "custom:groups"
    else:
        assert variables["MESSENGER_DASHBOARD_CLIENT_ID"] == "dashboard"
        assert variables["MESSENGER_DASHBOARD_GROUPS_CLAIM"] == "groups"


def test_the_created_pool_is_closed_and_groups_are_set_by_administrators_only(
        synthesized: Synthesized) -> None:
    template = synthesized.template("dcog")
    template.has_resource_properties("AWS::Cognito::UserPool", {
        "AdminCreateUserConfig": {"AllowAdminCreateUserOnly": True},
        "MfaConfiguration": "ON",
        "Schema": Match.array_with([Match.object_like({"Name": "groups", "Mutable": True})]),
    })
    (client,) = synthesized.of_type("dcog", "AWS::Cognito::UserPoolClient").values()
    properties = client["Properties"]
    assert properties["GenerateSecret"] is True
    assert properties["AllowedOAuthFlows"] == ["code"]
    assert properties["CallbackURLs"] == ["https://dcog.example.com/oauth2/idpresponse"]
    assert "custom:groups" in properties["ReadAttributes"]
    assert "custom:groups" not in properties["WriteAttributes"]


def _statements(synthesized: Synthesized, stack: str) -> list[dict[str, Any]]:
    (function,) = [f for f in synthesized.of_type(stack, "AWS::Lambda::Function").values()
                   if "MESSENGER_DASHBOARD_ALB_ARN" in json.dumps(f)]
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    (policy,) = [r for r in synthesized.of_type(stack, "AWS::IAM::Policy").values()
                 if {"Ref": role} in r["Properties"]["Roles"]]
    return list(policy["Properties"]["PolicyDocument"]["Statement"])


def _actions(statement: dict[str, Any]) -> list[str]:
    actions = statement["Action"]
    return actions if isinstance(actions, list) else [actions]


def test_the_role_reads_the_namespace_and_writes_only_what_operators_do(
        synthesized: Synthesized) -> None:
    statements = _statements(synthesized, "dcog")
    text = json.dumps(statements)
    # Only the operators' writes: SQS receive/delete on the namespace's DLQs, send to its
    # queues, status records
    by_sid = {s.get("Sid"): s for s in statements if s.get("Sid")}
    assert by_sid["OperateDeadLetters"]["Resource"] == [
        {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"},
                           f":sqs:{REGION}:{ACCOUNT}:dcog-*-dlq"]]},
        {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"},
                           f":sqs:{REGION}:{ACCOUNT}:dcog-*-dlq.fifo"]]}]
    assert _actions(by_sid["RequeueToQueues"]) == ["sqs:SendMessage"]
    assert f":sqs:{REGION}:{ACCOUNT}:dcog-*" in json.dumps(by_sid["RequeueToQueues"])
    assert sorted(_actions(by_sid["RecordOperatorActions"])) == [
        "dynamodb:BatchWriteItem", "dynamodb:PutItem"]
    assert "table/dcog-messenger-status" in json.dumps(by_sid["RecordOperatorActions"])
    assert sorted(_actions(by_sid["CancelScheduledJobs"])) == [
        "scheduler:DeleteSchedule", "scheduler:GetSchedule"]
    assert "schedule/dcog-messenger/*" in json.dumps(by_sid["CancelScheduledJobs"])
    # Pause/resume: the namespace's queues' tag and Lambda mappings; cancel: a registry item
    assert sorted(_actions(by_sid["PauseQueues"])) == ["sqs:TagQueue", "sqs:UntagQueue"]
    assert f":sqs:{REGION}:{ACCOUNT}:dcog-*" in json.dumps(by_sid["PauseQueues"])
    # ... and only the mappings invoking the namespace's consumer functions (a mapping's ARN
    # is a UUID, so the condition on the function it invokes is what limits it)
    pause_lambda = by_sid["PauseLambdaConsumers"]
    assert _actions(pause_lambda) == ["lambda:UpdateEventSourceMapping"]
    assert pause_lambda["Resource"] == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"},
        f":lambda:{REGION}:{ACCOUNT}:event-source-mapping:*"]]}
    assert pause_lambda["Condition"] == {"ArnLike": {"lambda:FunctionArn": [{"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"},
        f":lambda:{REGION}:{ACCOUNT}:function:dcog-messenger-consumer-*"]]}]}}
    assert _actions(by_sid["CancelRunningJobs"]) == ["dynamodb:PutItem"]
    assert "table/dcog-messenger-workers" in json.dumps(by_sid["CancelRunningJobs"])
    every_action = {a for s in statements for a in _actions(s)}
    assert not any(a.endswith("*") and a != "kms:GenerateDataKey*" for a in every_action), \
        every_action
    # A pause's record (its source of truth): put and deleted in its partition only
    assert _actions(by_sid["RecordPauses"]) == ["dynamodb:DeleteItem", "dynamodb:PutItem"]
    assert "table/dcog-messenger-workers" in json.dumps(by_sid["RecordPauses"])
    assert by_sid["RecordPauses"]["Condition"] == {"ForAllValues:StringEquals": {
        "dynamodb:LeadingKeys": [PAUSE_PARTITION]}}
    assert [s for s in statements if "dynamodb:DeleteItem" in _actions(s)] == \
        [by_sid["RecordPauses"]]
    for forbidden in ("sqs:DeleteQueue", "sqs:PurgeQueue", "sqs:SetQueueAttributes",
                      "dynamodb:UpdateItem", "s3:PutObject",
                      "s3:DeleteObject", "sns:Publish", "iam:PassRole"):
        assert forbidden not in every_action
    # '*' only for the actions that have no resource types
    starred = {a for s in statements if s["Resource"] == "*" for a in _actions(s)}
    assert starred <= {"tag:GetResources", "cloudwatch:GetMetricData", "scheduler:ListSchedules",
                       "lambda:ListEventSourceMappings",
                       "xray:PutTraceSegments", "xray:PutTelemetryRecords"}, starred
    assert "arn:aws:sqs:*" not in text


def test_the_grants_name_the_pause_records_partition_the_library_writes() -> None:
    assert PAUSE_RECORDS_PARTITION == PAUSE_PARTITION
