"""Deletion and termination rights reach only the platform's own resources, in every namespace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_kms as kms
from cdk_nag import AwsSolutionsChecks

import stacks.nag
from messenger.channel import TAG_MANAGED, TAG_NAMESPACE
from stacks.emr_pipeline import PIPELINE_TAG
from stacks.ops import OpsFunctions
from tests.infra.conftest import ACCOUNT, NAMESPACE, REGION, CloudAssembly, as_list

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
DESTRUCTIVE = {"sqs:DeleteQueue", "sns:DeleteTopic"}
#: From the Service Authorization Reference (Amazon SNS): actions with no resource types and no
#: condition keys. A statement naming ARNs, or conditioned on a service or aws:ResourceTag key,
#: never allows them on AWS; only Resource "*" with global condition keys does.
NO_RESOURCE_TYPES = {"sns:Unsubscribe"}
GLOBAL_KEYS = {"aws:RequestedRegion", "aws:SourceIp", "aws:SourceVpce", "aws:PrincipalTag"}


def _destructive(statements: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in statements if s["Effect"] == "Allow"
            and DESTRUCTIVE & set(as_list(s["Action"]))]


def _assert_evaluable_by_aws(statements: list[dict[str, Any]]) -> None:
    """Every action without resource types is granted on "*" with global keys only, in a
    statement of its own (mixed with scoped actions, it would be refused)."""
    for action in NO_RESOURCE_TYPES:
        granting = [s for s in statements if action in as_list(s["Action"])]
        assert len(granting) == 1, action
        (statement,) = granting
        assert as_list(statement["Action"]) == [action]
        assert statement["Resource"] == "*"
        keys = {key for operator in statement.get("Condition", {}).values() for key in operator}
        assert keys <= GLOBAL_KEYS, keys
        assert statement["Condition"] == {"StringEquals": {"aws:RequestedRegion": {
            "Ref": "AWS::Region"}}}


def _cleaner_statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    (policy,) = [r for k, r in template["Resources"].items()
                 if r["Type"] == "AWS::IAM::Policy" and "ResourceCleanerRole" in k]
    return policy["Properties"]["PolicyDocument"]["Statement"]


def test_the_cleaner_deletes_only_resources_tagged_in_its_namespace(
    assembly: CloudAssembly,
) -> None:
    statements = _cleaner_statements(assembly.template("platform"))
    deletes = _destructive(statements)
    # (the reads of the same queues and topics carry the same condition: one statement each)
    assert {a for s in deletes for a in as_list(s["Action"])} & DESTRUCTIVE == DESTRUCTIVE
    for statement in deletes:
        assert f":{NAMESPACE}-*" in json.dumps(statement["Resource"])
        assert statement["Condition"] == {"StringEquals": {
            f"aws:ResourceTag/{TAG_MANAGED}": "true",
            f"aws:ResourceTag/{TAG_NAMESPACE}": NAMESPACE,
        }}
    # Only the guarded statements may destroy anything
    others = [s for s in statements if s not in deletes]
    assert not any("Delete" in a for s in others for a in as_list(s["Action"]))
    # sns:Unsubscribe (no resource types, no condition keys) in a form AWS evaluates
    _assert_evaluable_by_aws(statements)


def test_with_the_default_namespace_the_cleaner_still_deletes_only_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the ops functions of the default namespace (no name prefix), cdk-nag on, and the
    # acknowledgements recorded as well as applied
    recorded: list[tuple[str, str]] = []
    acknowledge = stacks.nag.acknowledge

    def recording(scope: Any, rule: str, reason: str) -> None:
        recorded.append((rule, reason))
        acknowledge(scope, rule, reason)

    monkeypatch.setattr(stacks.nag, "acknowledge", recording)
    app = cdk.App(outdir=str(tmp_path), context=CONTEXT)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack = cdk.Stack(app, "Ops", env=cdk.Environment(account=ACCOUNT, region=REGION))
    OpsFunctions(stack, "Ops", namespace="", slack_webhook_secret="messenger/slack-webhook",
                 key=kms.Key(stack, "Key", enable_key_rotation=True))
    # When synthesized (cdk-nag finds nothing unacknowledged)
    template = app.synth().get_stack_by_name("Ops").template
    # Then every right to delete names every queue/topic by pattern but requires the platform's
    # tag and the absence of a namespace tag: another namespace's or a foreign resource is safe
    deletes = _destructive(_cleaner_statements(template))
    _assert_evaluable_by_aws(_cleaner_statements(template))
    assert {a for s in deletes for a in as_list(s["Action"])} & DESTRUCTIVE == DESTRUCTIVE
    for statement in deletes:
        assert statement["Condition"] == {
            "StringEquals": {f"aws:ResourceTag/{TAG_MANAGED}": "true"},
            "Null": {f"aws:ResourceTag/{TAG_NAMESPACE}": "true"},
        }
    # And the acknowledgement of those patterns says exactly that
    reasons = [reason for rule, reason in recorded if ":*]" in rule and "sqs" in rule]
    assert reasons and "default namespace has no name prefix" in reasons[0]
    assert "reading, tagging and deleting needs the tag messenger:managed=true and no " \
        "messenger:namespace" in reasons[0]
    # And every other statement on those patterns (the reads) needs the same tags
    for statement in _cleaner_statements(template):
        if ":sqs:" in json.dumps(statement["Resource"]) or \
                ":sns:" in json.dumps(statement["Resource"]):
            assert statement["Condition"] == deletes[0]["Condition"], statement


def test_the_state_machine_terminates_only_the_clusters_it_created(
    assembly: CloudAssembly,
) -> None:
    template = assembly.template("pipeline")
    (machine,) = [r for r in template["Resources"].values()
                  if r["Type"] == "AWS::StepFunctions::StateMachine"]
    role_id = machine["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    statements = [s for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                  and {"Ref": role_id} in r["Properties"]["Roles"]
                  for s in r["Properties"]["PolicyDocument"]["Statement"]]
    # Whatever the CDK tasks allow, TerminateJobFlows is denied on clusters without its tag
    (deny,) = [s for s in statements if s["Effect"] == "Deny"
               and "elasticmapreduce:TerminateJobFlows" in as_list(s["Action"])]
    assert as_list(deny["Action"]) == ["elasticmapreduce:TerminateJobFlows"]
    (tag_value,) = deny["Condition"]["StringNotEquals"].values()
    assert deny["Condition"] == {
        "StringNotEquals": {f"aws:ResourceTag/{PIPELINE_TAG}": tag_value}
    }
    # And the clusters it creates carry exactly that tag
    parts = machine["Properties"]["DefinitionString"]["Fn::Join"][1]
    definition = json.loads("".join(p if isinstance(p, str) else "TOKEN" for p in parts))
    create = definition["States"]["CreateCluster"]
    assert create["Resource"].endswith("elasticmapreduce:createCluster.sync")
    assert {"Key": PIPELINE_TAG, "Value": tag_value} in create["Parameters"]["Tags"]


def test_no_role_may_be_passed_to_any_service(assembly: CloudAssembly) -> None:
    # iam:PassRole without an iam:PassedToService condition lets the holder hand the role to
    # any service (a Lambda function or an EC2 instance of its own): every allowed PassRole
    # is conditioned, or a Deny in the same policy limits each role it names to one service.
    passing = 0
    for path, policy in assembly.resources("AWS::IAM::Policy").items():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        limited = {
            json.dumps(s["Resource"]): s["Condition"]["StringNotLike"]["iam:PassedToService"]
            for s in statements
            if s["Effect"] == "Deny" and "iam:PassRole" in as_list(s["Action"])
        }
        for statement in statements:
            if statement["Effect"] != "Allow" or "iam:PassRole" not in as_list(
                    statement["Action"]):
                continue
            passing += 1
            conditions = json.dumps(statement.get("Condition", {}))
            if "iam:PassedToService" in conditions:
                continue
            for role in as_list(statement["Resource"]):
                assert json.dumps(role) in limited, (path, role)
    assert passing >= 2  # the EMR service role's and the state machine's
    # The EMR service role passes the job role to EC2 only, in exactly one statement
    (service_policy,) = [p for k, p in assembly.resources("AWS::IAM::Policy", "pipeline").items()
                         if "EmrServiceRoleDefaultPolicy" in k]
    (pass_role,) = [s for s in service_policy["Properties"]["PolicyDocument"]["Statement"]
                    if "iam:PassRole" in as_list(s["Action"])]
    assert pass_role["Condition"] == {
        "StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    # And the state machine may pass each EMR role only where EMR's own policy passes it
    (machine_policy,) = [p for k, p in assembly.resources("AWS::IAM::Policy", "pipeline").items()
                         if "RunSparkJobRoleDefaultPolicy" in k]
    denies = {json.dumps(s["Resource"]): s["Condition"]["StringNotLike"]["iam:PassedToService"]
              for s in machine_policy["Properties"]["PolicyDocument"]["Statement"]
              if s["Effect"] == "Deny" and "iam:PassRole" in as_list(s["Action"])}
    assert sorted(denies.values()) == [
        "application-autoscaling.amazonaws.com*", "ec2.amazonaws.com*",
        "elasticmapreduce.amazonaws.com*"]
    assert all("Emr" in role for role in denies)
