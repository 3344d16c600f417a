"""`DashboardService` (stacks/dashboard_service.py) through `PlatformStack.add_dashboard`: one
in-process synth per session of two platforms, one signing in with a Cognito pool the construct
creates, one with a team's OIDC provider; cdk-nag on. HTTPS only, the authenticate action before
the forward and no rule around it, a function only the load balancer may invoke, and a role that
reads the namespace and writes only what operators do."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_certificatemanager as acm
from aws_cdk.assertions import Match
from cdk_nag import AwsSolutionsChecks

from messenger.channel import TAG_NAMESPACE, ChannelSpec, exchange_tags
from messenger.jobs.controls import PAUSE_PARTITION, TAG_PAUSED, CancelRequest
from messenger.jobs.workers import WorkerEntry
from stacks.config import MessengerConfig
from stacks.dashboard_service import (
    CANCEL_REQUEST_ATTRIBUTES,
    PAUSE_RECORDS_PARTITION,
    CognitoLogin,
    OidcLogin,
)
from stacks.dashboard_service import TAG_PAUSED as DASHBOARD_TAG_PAUSED
from stacks.messenger_app import build_app
from stacks.ops import PAUSE_TAG as OPS_PAUSE_TAG
from stacks.ownership import ownership_condition
from stacks.platform_stack import PlatformStack
from tests.docs import code_blocks, doc_text
from tests.infra.conftest import ACCOUNT, REGION
from tests.infra.synthesized import Synthesized, synthesize
from tests.infra.tag_conditions import tags_meet

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
CERT = f"arn:aws:acm:{REGION}:{ACCOUNT}:certificate/11111111-2222-3333-4444-555555555555"
WEB_ACL = f"arn:aws:wafv2:{REGION}:{ACCOUNT}:regional/webacl/dashboard/1234"


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    outdir = tmp_path_factory.mktemp("dashboard-service")
    app = cdk.App(outdir=str(outdir), context=CONTEXT, builtin_cloud_formation_validation=False)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    env = cdk.Environment(account=ACCOUNT, region=REGION)
    for name, login, options in (
        ("dcog", CognitoLogin(domain_prefix="dcog-messenger"), {}),
        ("doidc", _oidc(cdk.SecretValue.secrets_manager("messenger/dashboard-oidc")),
         {"web_acl_arn": WEB_ACL, "deletion_protection": False}),
    ):
        platform = PlatformStack(app, name, config=MessengerConfig(namespace=name), env=env)
        platform.add_dashboard(
            certificate=acm.Certificate.from_certificate_arn(platform, "Cert", CERT),
            domain_name=f"{name}.example.com", login=login, operator_groups=["ops", "admins"],
            **options)
    return synthesize(app, outdir)


def _oidc(secret: cdk.SecretValue) -> OidcLogin:
    return OidcLogin(
        issuer="https://idp.example", authorization_endpoint="https://idp.example/auth",
        token_endpoint="https://idp.example/token",
        user_info_endpoint="https://idp.example/userinfo", client_id="dashboard",
        client_secret=secret)


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
    # ... and through this target group only: its name (unique in the account and region),
    # its ARN's random suffix (made at deploy, after the permission: a Ref would be a cycle)
    (group,) = synthesized.of_type(stack, "AWS::ElasticLoadBalancingV2::TargetGroup").values()
    name = group["Properties"]["Name"]
    assert isinstance(name, str) and len(name) <= 32 and stack in name.lower()
    assert permission["SourceArn"] == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"},
        f":elasticloadbalancing:{REGION}:{ACCOUNT}:targetgroup/{name}/*"]]}
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
    # (queues are made at run time too: the namespace's tags say which are its own; a name
    # prefix would not: 'dcog-*' matches namespace dcog-eu's queues)
    every_queue = {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"},
                                     f":sqs:{REGION}:{ACCOUNT}:*"]]}
    ours = ownership_condition("dcog")
    assert ours["StringEquals"][f"aws:ResourceTag/{TAG_NAMESPACE}"] == "dcog"
    assert by_sid["OperateDeadLetters"]["Resource"] == every_queue
    assert by_sid["OperateDeadLetters"]["Condition"] == ownership_condition("dcog", "dlq")
    assert by_sid["ReadQueues"]["Condition"] == ours
    assert _actions(by_sid["RequeueToQueues"]) == ["sqs:SendMessage"]
    assert by_sid["RequeueToQueues"]["Resource"] == every_queue
    assert by_sid["RequeueToQueues"]["Condition"] == ours
    assert sorted(_actions(by_sid["RecordOperatorActions"])) == [
        "dynamodb:BatchWriteItem", "dynamodb:PutItem"]
    assert "table/dcog-messenger-status" in json.dumps(by_sid["RecordOperatorActions"])
    assert sorted(_actions(by_sid["CancelScheduledJobs"])) == [
        "scheduler:DeleteSchedule", "scheduler:GetSchedule"]
    assert "schedule/dcog-messenger/*" in json.dumps(by_sid["CancelScheduledJobs"])
    # ... after taking the job's claim: the dedup table's consumer claims (fired@) only
    claims = by_sid["ClaimCancelledJobs"]
    assert sorted(_actions(claims)) == [
        "dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem"]
    assert "table/dcog-messenger-dedup" in json.dumps(claims)
    assert claims["Condition"] == {"ForAllValues:StringLike": {
        "dynamodb:LeadingKeys": ["fired@*"]}}
    assert _actions(by_sid["CheckClaimsTable"]) == ["dynamodb:DescribeTable"]
    # ... on every consumer channel of an exchange job: one TransactWriteItems, which IAM
    # authorizes as a PutItem per item (no dynamodb:TransactWriteItems action exists), and the
    # topic's subscriptions listed first: the namespace's topics only
    assert not any(a.startswith("dynamodb:Transact") for s in statements for a in _actions(s))
    listing = by_sid["ListExchangeSubscriptions"]
    assert _actions(listing) == ["sns:ListSubscriptionsByTopic"]
    assert listing["Resource"] == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"}, f":sns:{REGION}:{ACCOUNT}:*"]]}
    assert listing["Condition"] == ownership_condition("dcog", "topic")
    assert tags_meet(listing["Condition"], exchange_tags("alerts", "dcog"))
    assert not tags_meet(listing["Condition"], exchange_tags("alerts", "dcog-eu"))
    assert not tags_meet(listing["Condition"], exchange_tags("alerts"))
    # ... then each subscribed queue's channel tag (and the track-status declaration of a
    # job's channel): ReadQueues, the namespace's queues
    assert {"sqs:GetQueueUrl", "sqs:ListQueueTags"} <= set(_actions(by_sid["ReadQueues"]))
    assert tags_meet(by_sid["ReadQueues"]["Condition"],
                     ChannelSpec("alerts.sms", namespace="dcog").resource_tags("queue"))
    # Pause/resume: the namespace's queues' tag and Lambda mappings; cancel: a registry item
    assert sorted(_actions(by_sid["PauseQueues"])) == ["sqs:TagQueue", "sqs:UntagQueue"]
    # ... the messenger:paused tag only (never the tags that say whose a queue is)
    assert by_sid["PauseQueues"]["Condition"] == {
        **ours, "ForAllValues:StringEquals": {"aws:TagKeys": [TAG_PAUSED]}}
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
    # A cancel request's item only: never in the pause records' partition (which would void
    # RecordPauses' condition), never with a worker entry's attributes
    assert by_sid["CancelRunningJobs"]["Condition"] == {
        "ForAllValues:StringNotEquals": {"dynamodb:LeadingKeys": [PAUSE_PARTITION]},
        "ForAllValues:StringEquals": {"dynamodb:Attributes": list(
            CANCEL_REQUEST_ATTRIBUTES)}}
    assert sorted(CancelRequest("orders", "m-1", "ann", 1.0).item()) == sorted(
        CANCEL_REQUEST_ATTRIBUTES)
    worker = set(WorkerEntry.__dataclass_fields__)
    assert worker - set(CANCEL_REQUEST_ATTRIBUTES)  # a worker's entry is refused
    put_items = [s for s in statements if "dynamodb:PutItem" in _actions(s)
                 and "workers" in json.dumps(s["Resource"])]
    assert all("Condition" in s for s in put_items), put_items
    every_action = {a for s in statements for a in _actions(s)}
    assert not any(a.endswith("*") and a != "kms:GenerateDataKey*" for a in every_action), \
        every_action
    # A pause's record (its source of truth): put and deleted in its partition only
    assert _actions(by_sid["RecordPauses"]) == ["dynamodb:DeleteItem", "dynamodb:PutItem"]
    assert "table/dcog-messenger-workers" in json.dumps(by_sid["RecordPauses"])
    assert by_sid["RecordPauses"]["Condition"] == {"ForAllValues:StringEquals": {
        "dynamodb:LeadingKeys": [PAUSE_PARTITION]}}
    assert [s for s in statements if "dynamodb:DeleteItem" in _actions(s)] == \
        [by_sid["ClaimCancelledJobs"], by_sid["RecordPauses"]]
    for forbidden in ("sqs:DeleteQueue", "sqs:PurgeQueue", "sqs:SetQueueAttributes",
                      "s3:PutObject", "s3:DeleteObject", "iam:PassRole"):
        assert forbidden not in every_action
    # An operator's final action settles the job (its outcome on the status table, what waits
    # on it counted in the workflows table, a held job released to its queue or topic); a
    # limit set is one UpdateItem of the limits table: UpdateItem on those tables only, and
    # sns:Publish on the namespace's topics only
    updates = [r for s in statements if "dynamodb:UpdateItem" in _actions(s)
               for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])]
    assert updates and all(any(table in json.dumps(r) for table in (
        "dcog-messenger-limits", "dcog-messenger-workflows", "StatusTable")) for r in updates), \
        updates
    publishes = [s for s in statements if "sns:Publish" in _actions(s)]
    assert publishes and all(s["Condition"] == ownership_condition("dcog", "topic")
                             for s in publishes)
    # '*' only for the actions that have no resource types
    starred = {a for s in statements if s["Resource"] == "*" for a in _actions(s)}
    assert starred <= {"tag:GetResources", "cloudwatch:GetMetricData", "scheduler:ListSchedules",
                       "lambda:ListEventSourceMappings",
                       "xray:PutTraceSegments", "xray:PutTelemetryRecords"}, starred
    assert "arn:aws:sqs:*" not in text


def test_operators_read_flow_control_and_write_only_channels_limits_records(
        synthesized: Synthesized) -> None:
    # The channel page's limits (LimitStore.show) and an operator's change (LimitStore.set:
    # one UpdateItem of 'limits#<channel>'), never a rate limiter, lease or report
    by_sid = {s.get("Sid"): s for s in _statements(synthesized, "dcog") if s.get("Sid")}
    table = "table/dcog-messenger-limits"
    assert sorted(_actions(by_sid["ReadFlowControl"])) == [
        "dynamodb:BatchGetItem", "dynamodb:DescribeTable", "dynamodb:GetItem"]
    assert json.dumps(by_sid["ReadFlowControl"]["Resource"]).endswith(f'{table}"]]}}')
    assert _actions(by_sid["SetChannelLimits"]) == ["dynamodb:UpdateItem"]
    assert json.dumps(by_sid["SetChannelLimits"]["Resource"]).endswith(f'{table}"]]}}')
    assert by_sid["SetChannelLimits"]["Condition"] == {"ForAllValues:StringLike": {
        "dynamodb:LeadingKeys": ["limits#*"]}}


def test_the_grants_name_the_pause_records_partition_the_library_writes() -> None:
    assert PAUSE_RECORDS_PARTITION == PAUSE_PARTITION
    assert DASHBOARD_TAG_PAUSED == TAG_PAUSED == OPS_PAUSE_TAG


# -- WAF, deletion protection, the OIDC secret (issue 50 items 6, 14) ---------------------------
def test_deletion_protection_is_on_by_default_and_a_web_acl_when_given(
        synthesized: Synthesized) -> None:
    def attributes(stack: str) -> dict[str, str]:
        (alb,) = synthesized.of_type(stack, "AWS::ElasticLoadBalancingV2::LoadBalancer").values()
        return {a["Key"]: a["Value"] for a in alb["Properties"]["LoadBalancerAttributes"]}

    assert attributes("dcog")["deletion_protection.enabled"] == "true"
    assert attributes("doidc")["deletion_protection.enabled"] == "false"  # asked for
    assert synthesized.of_type("dcog", "AWS::WAFv2::WebACLAssociation") == {}
    (association,) = synthesized.of_type("doidc", "AWS::WAFv2::WebACLAssociation").values()
    (alb,) = synthesized.of_type("doidc", "AWS::ElasticLoadBalancingV2::LoadBalancer")
    assert association["Properties"] == {"WebACLArn": WEB_ACL, "ResourceArn": {"Ref": alb}}


def test_an_oidc_secret_in_plain_text_is_refused_at_synth(tmp_path: Path) -> None:
    app = cdk.App(outdir=str(tmp_path), context=CONTEXT)
    platform = PlatformStack(app, "plain", config=MessengerConfig(namespace="plain"),
                             env=cdk.Environment(account=ACCOUNT, region=REGION))
    certificate = acm.Certificate.from_certificate_arn(platform, "Cert", CERT)
    for secret in (cdk.SecretValue.unsafe_plain_text("s3cr3t-value"),
                   cdk.SecretValue.ssm_secure("/dashboard/oidc")):
        with pytest.raises(ValueError, match="must come from Secrets Manager") as error:
            platform.add_dashboard(id=f"D{len(platform.node.children)}", certificate=certificate,
                                   domain_name="plain.example.com", login=_oidc(secret))
        assert "\n" not in str(error.value) and "s3cr3t" not in str(error.value)


# -- the docs' snippet, offline (issue 50 item 12) ----------------------------------------------
@pytest.fixture(scope="session")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """docs/dashboard.md's `add_dashboard` lines, exactly as written, in the app as the README's
    `npx cdk synth` builds it without credentials: no account, no region (environment-agnostic
    stacks), cdk-nag on; the platform only."""
    (snippet,) = [b for b in code_blocks(doc_text("docs/dashboard.md"), "python")
                  if "platform.add_dashboard(" in b]
    outdir = tmp_path_factory.mktemp("dashboard-offline")
    app = cdk.App(outdir=str(outdir), context=CONTEXT, builtin_cloud_formation_validation=False)
    config = MessengerConfig(example_channels=False, pipeline=False)
    assert config.account is None and config.region is None
    platform = build_app(app, config).platform
    exec(compile(snippet, "docs/dashboard.md", "exec"),  # noqa: S102
         {"__name__": "app_main", "app": app, "platform": platform})
    return synthesize(app, outdir)


@pytest.mark.xdist_group("dashboard-offline")
def test_the_docs_dashboard_synthesizes_offline_with_its_access_logs(
        offline: Synthesized, tmp_path: Path) -> None:
    assert offline.violations == []  # no RegionRequiredEnableBvAccess, cdk-nag clean
    (stack,) = offline.templates
    template = offline.templates[stack]
    (alb_id, alb), = offline.of_type(stack, "AWS::ElasticLoadBalancingV2::LoadBalancer").items()
    attributes = {a["Key"]: a["Value"] for a in alb["Properties"]["LoadBalancerAttributes"]}
    assert attributes["access_logs.s3.enabled"] == "true"
    assert attributes["access_logs.s3.prefix"] == "dashboard-alb"
    bucket = attributes["access_logs.s3.bucket"]["Ref"]
    assert offline.of_type(stack, "AWS::S3::Bucket")[bucket]
    # The bucket policy lets the region's delivering principal write, chosen at deploy time:
    # Elastic Load Balancing's account in the regions that have one, the service principal
    (policy_id, policy), = [(k, p) for k, p in offline.of_type(
        stack, "AWS::S3::BucketPolicy").items() if p["Properties"]["Bucket"] == {"Ref": bucket}]
    assert policy_id in alb["DependsOn"]
    puts = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
            if s["Action"] == "s3:PutObject" and s["Effect"] == "Allow"
            and "/offload/" not in json.dumps(s["Resource"])]  # (S3's own server access logs)
    principals = [s["Principal"] for s in puts]  # (minimized: one statement may hold both)
    assert any(p.get("Service") == "logdelivery.elasticloadbalancing.amazonaws.com"
               for p in principals)
    (by_account,) = [p["AWS"] for p in principals if "AWS" in p]
    condition, legacy, newer = by_account["Fn::If"]
    assert "ElbLogDeliveryAccounts" in json.dumps(legacy)
    assert "AWS::AccountId" in json.dumps(newer)
    for statement in puts:
        assert "/dashboard-alb/AWSLogs/" in json.dumps(statement["Resource"])
    accounts = template["Mappings"]["ElbLogDeliveryAccounts"]
    assert accounts["eu-west-1"] == {"account": "156460612806"}  # AWS's documented account
    assert accounts["us-east-1"] == {"account": "127311923021"}
    regions = set(re.findall(r'"([a-z]{2}(?:-[a-z]+)+-\d)"', json.dumps(
        template["Conditions"][condition])))
    assert regions == set(accounts)
    # And CloudFormation takes it in a region with an account, one without, the US (cfn-lint:
    # the mapping, the nested Fn::Or, Fn::If in the principal)
    path = tmp_path / "offline.template.json"
    path.write_text(json.dumps(template))
    result = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--regions", "eu-west-1", "us-east-1",
         "ap-east-2", "--ignore-checks", "W3005", "--", str(path)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_with_a_region_the_access_logs_are_cdks_own(synthesized: Synthesized) -> None:
    # The pinned case (account and region known) is CDK's log_access_logs: the region's
    # account, no mapping
    template = synthesized.templates["dcog"]
    assert "ElbLogDeliveryAccounts" not in json.dumps(template)
    policies = json.dumps([p["Properties"] for p in synthesized.of_type(
        "dcog", "AWS::S3::BucketPolicy").values()])
    assert ":iam::156460612806:root" in policies
