"""The dashboard's audit trail table (issue 50 items 8-9) in the synthesized template: made with
the dashboard (so a namespace without a status table has it), named as the library names it,
retained, deletion-protected, encrypted with the platform key, point-in-time recovery on; the
dashboard's role may describe, put and query it, and nothing else (no update, delete or batch
write: an entry is never changed or removed through the dashboard). cdk-nag clean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_certificatemanager as acm
from cdk_nag import AwsSolutionsChecks

from messenger.channel import audit_table_name
from stacks.config import MessengerConfig
from stacks.dashboard_service import CognitoLogin
from stacks.platform_stack import PlatformStack
from tests.infra.conftest import ACCOUNT, REGION
from tests.infra.synthesized import Synthesized, synthesize

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
CERT = f"arn:aws:acm:{REGION}:{ACCOUNT}:certificate/11111111-2222-3333-4444-555555555555"
STACK = "daudit"


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    outdir = tmp_path_factory.mktemp("dashboard-audit")
    app = cdk.App(outdir=str(outdir), context=CONTEXT, builtin_cloud_formation_validation=False)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    platform = PlatformStack(app, STACK, config=MessengerConfig(namespace=STACK),
                             env=cdk.Environment(account=ACCOUNT, region=REGION))
    platform.add_dashboard(
        certificate=acm.Certificate.from_certificate_arn(platform, "Cert", CERT),
        domain_name="audit.example.com", login=CognitoLogin(domain_prefix="daudit-messenger"))
    return synthesize(app, outdir)


def statements(synthesized: Synthesized) -> list[dict[str, Any]]:
    found = []
    for policy in synthesized.of_type(STACK, "AWS::IAM::Policy").values():
        found.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return found


def names_audit_table(resource: Any) -> bool:
    return audit_table_name(STACK) in json.dumps(resource)


def test_the_audit_table_is_made_with_the_dashboard_and_kept(synthesized: Synthesized) -> None:
    assert synthesized.violations == []
    (table,) = [t for t in synthesized.of_type(STACK, "AWS::DynamoDB::Table").values()
                if t["Properties"].get("TableName") == audit_table_name(STACK)]
    properties = table["Properties"]
    assert properties["KeySchema"] == [{"AttributeName": "day", "KeyType": "HASH"},
                                       {"AttributeName": "entry", "KeyType": "RANGE"}]
    assert table["DeletionPolicy"] == "Retain"
    assert properties["DeletionProtectionEnabled"] is True
    assert properties["PointInTimeRecoverySpecification"] == {
        "PointInTimeRecoveryEnabled": True}
    assert properties["SSESpecification"]["SSEEnabled"] is True
    assert "KMSMasterKeyId" in properties["SSESpecification"]
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "expires_at",
                                                     "Enabled": True}


def test_the_dashboard_may_only_append_to_and_read_the_audit_table(
        synthesized: Synthesized) -> None:
    on_audit = [s for s in statements(synthesized) if names_audit_table(s.get("Resource"))]
    assert len(on_audit) == 1
    (statement,) = on_audit
    assert statement["Sid"] == "AppendAuditTrail" and statement["Effect"] == "Allow"
    assert sorted(statement["Action"]) == ["dynamodb:DescribeTable", "dynamodb:PutItem",
                                           "dynamodb:Query"]
    # No statement with a wildcard table reaches it either
    for other in statements(synthesized):
        actions = other["Action"] if isinstance(other["Action"], list) else [other["Action"]]
        writes = {"dynamodb:UpdateItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem",
                  "dynamodb:*", "*"} & set(actions)
        if writes:
            resources = json.dumps(other["Resource"])
            assert "table/*" not in resources and '"*"' not in resources, other
