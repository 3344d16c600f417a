"""What synth derives from a consumer class instead of an argument to forget: the idempotency
table grant, on Fargate and Lambda alike (one in-process synth per session)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk.assertions import Annotations, Match, Template

from messenger.channel import (
    FIRED_CLAIM_PREFIX,
    ChannelSpec,
    dedup_table_name,
    idempotency_table_name,
)
from messenger.jobs.fired import KEY_PREFIX
from stacks.channel import Channel
from stacks.consumer_image import ConsumerImage
from stacks.consumer_service import ConsumerService
from stacks.foundation import Foundation
from stacks.lambda_consumer import LambdaConsumer
from tests.infra.conftest import ACCOUNT, REGION
from tests.infra.test_validation import PLATFORM_CLUSTER, _app

NAMESPACE = "derived"
#: A team's folder `jobs/`: two idempotent classes (one by `idempotent = True`, one by
#: `idempotency_key`) and two plain ones, none deployed with an `idempotent=` argument.
CONSUMERS = '''
from messenger import Consumer


class Job(Consumer):
    processing_timeout = 10

    def handler(self, message):
        pass


class FargatePlain(Job):
    channel = "fargate_plain"


class FargateIdempotent(Job):
    channel = "fargate_idempotent"
    idempotent = True


class LambdaPlain(Job):
    channel = "lambda_plain"


class LambdaKeyed(Job):
    channel = "lambda_keyed"
    idempotency_key = staticmethod(lambda message: message.body["order"])
'''
FARGATE = {"FargatePlain": "fargate_plain", "FargateIdempotent": "fargate_idempotent"}
LAMBDA = {"LambdaPlain": "lambda_plain", "LambdaKeyed": "lambda_keyed"}
IDEMPOTENT = {"FargateIdempotent", "LambdaKeyed"}
#: Powertools' calls on its records (`Foundation.grant_idempotency`), as the minimized policy
#: lists them.
POWERTOOLS_ACTIONS = ["dynamodb:DeleteItem", "dynamodb:DescribeTable", "dynamodb:GetItem",
                      "dynamodb:PutItem", "dynamodb:UpdateItem"]


def _team_folder(parent: Path) -> Path:
    code = parent / "jobs"
    code.mkdir()
    (code / "consumers.py").write_text(CONSUMERS)
    return code


def _jobs_stack(folder: Path) -> tuple[cdk.App, cdk.Stack, Foundation, Path]:
    """An app with one stack holding the foundation, and the team's folder beside it."""
    app = _app(folder / "cdk.out")
    stack = cdk.Stack(app, "Jobs", env=cdk.Environment(account=ACCOUNT, region=REGION))
    return app, stack, Foundation(stack, "Foundation", namespace=NAMESPACE), _team_folder(folder)


def _cluster(stack: cdk.Stack) -> ecs.Cluster:
    vpc = ec2.Vpc(stack, "Vpc", nat_gateways=0, availability_zones=["eu-west-1a"])
    return ecs.Cluster(stack, "Cluster", vpc=vpc, **PLATFORM_CLUSTER)


def _lambda_spec(channel: str) -> ChannelSpec:
    # 6 x the function's timeout (10 s + 3 s to finish) fits in the visibility timeout
    return ChannelSpec(channel, namespace=NAMESPACE, visibility_timeout=120)


@dataclass
class DerivedGrants:
    template: Template
    roles: dict[str, str]  # consumer class -> its role's logical id
    table: str  # the idempotency table's logical id


@pytest.fixture(scope="session")
def derived(tmp_path_factory: pytest.TempPathFactory) -> DerivedGrants:
    """Two Fargate services and two Lambda consumers of the team's classes, in one stack."""
    _, stack, foundation, code = _jobs_stack(tmp_path_factory.mktemp("derived"))
    cluster = _cluster(stack)
    image = ConsumerImage.from_code(code)
    roles = {}
    for name, channel in FARGATE.items():
        spec = ChannelSpec(channel, namespace=NAMESPACE)
        service = ConsumerService(
            stack, name, channel=Channel(stack, f"{name}Channel", spec=spec, key=foundation.key),
            foundation=foundation, cluster=cluster, image=image,
            consumer_class=f"jobs.consumers:{name}", namespace=NAMESPACE)
        roles[name] = service.task_role
    for name, channel in LAMBDA.items():
        spec = _lambda_spec(channel)
        function = LambdaConsumer(
            stack, name, channel=Channel(stack, f"{name}Channel", spec=spec, key=foundation.key),
            foundation=foundation, code=code, consumer_class=f"jobs.consumers:{name}",
            namespace=NAMESPACE)
        roles[name] = function.role
    template = Template.from_stack(stack)
    return DerivedGrants(
        template,
        {name: stack.get_logical_id(role.node.default_child) for name, role in roles.items()},
        stack.get_logical_id(foundation.idempotency_table.node.default_child),
    )


def _policies_naming(derived: DerivedGrants, logical_id: str) -> set[str]:
    """The roles whose policies name `logical_id` anywhere in their statements."""
    found = set()
    for policy in derived.template.find_resources("AWS::IAM::Policy").values():
        if logical_id in str(policy["Properties"]["PolicyDocument"]):
            found |= {role["Ref"] for role in policy["Properties"]["Roles"]}
    return found


def test_the_idempotency_table_is_granted_to_the_idempotent_classes_only(
    derived: DerivedGrants,
) -> None:
    # Given idempotent and plain classes on Fargate and Lambda, no `idempotent=` argument given
    # Then exactly the idempotent classes' roles may use the idempotency table
    assert derived.template.find_resources("AWS::DynamoDB::Table", {"Properties": {
        "TableName": idempotency_table_name(NAMESPACE)}}).keys() == {derived.table}
    assert _policies_naming(derived, derived.table) == {
        derived.roles[name] for name in IDEMPOTENT}


@pytest.mark.parametrize("consumer", sorted(IDEMPOTENT))
def test_an_idempotent_class_gets_powertools_calls_on_the_table(
    derived: DerivedGrants, consumer: str,
) -> None:
    derived.template.has_resource_properties("AWS::IAM::Policy", {
        "Roles": Match.array_with([{"Ref": derived.roles[consumer]}]),
        "PolicyDocument": {"Statement": Match.array_with([{
            "Action": POWERTOOLS_ACTIONS, "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [derived.table, "Arn"]},
        }])},
    })


@pytest.mark.parametrize("consumer", sorted({*FARGATE, *LAMBDA}))
def test_every_consumer_may_claim_fired_jobs_in_the_dedup_table_only_under_its_prefix(
    derived: DerivedGrants, consumer: str,
) -> None:
    # Given any consumer (any channel may get jobs fired by the scheduler)
    tables = derived.template.find_resources("AWS::DynamoDB::Table", {"Properties": {
        "TableName": dedup_table_name(NAMESPACE)}})
    (dedup,) = tables
    # Then its role may put and delete items of the dedup table whose key starts with the
    # consumers' prefix, and nothing else there (never a producer's claim)
    (policy,) = [p for p in derived.template.find_resources("AWS::IAM::Policy").values()
                 if {"Ref": derived.roles[consumer]} in p["Properties"]["Roles"]]
    on_dedup = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
                if dedup in json.dumps(s["Resource"])]
    writes = [s for s in on_dedup if s["Action"] != "dynamodb:DescribeTable"]
    assert writes == [{
        "Action": ["dynamodb:DeleteItem", "dynamodb:PutItem"], "Effect": "Allow",
        "Resource": {"Fn::GetAtt": [dedup, "Arn"]},
        "Condition": {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [
            f"{FIRED_CLAIM_PREFIX}*"]}}}]
    assert FIRED_CLAIM_PREFIX == KEY_PREFIX  # what messenger.jobs.fired writes


@pytest.mark.parametrize(("kind", "consumer", "given"), [
    ("ConsumerService", "FargateIdempotent", False),
    ("ConsumerService", "FargatePlain", True),
    ("LambdaConsumer", "LambdaKeyed", False),
])
def test_an_argument_contradicting_the_class_fails_synthesis(
    tmp_path: Path, kind: str, consumer: str, given: bool,
) -> None:
    # Given a consumer deployed with the deprecated argument saying the opposite of its class
    app, stack, foundation, code = _jobs_stack(tmp_path)
    if kind == "ConsumerService":
        spec = ChannelSpec(FARGATE[consumer], namespace=NAMESPACE)
        ConsumerService(
            stack, consumer, channel=Channel(stack, "Channel", spec=spec, key=foundation.key),
            foundation=foundation, cluster=_cluster(stack), image=ConsumerImage.from_code(code),
            consumer_class=f"jobs.consumers:{consumer}", namespace=NAMESPACE, idempotent=given)
    else:
        spec = _lambda_spec(LAMBDA[consumer])
        LambdaConsumer(
            stack, consumer, channel=Channel(stack, "Channel", spec=spec, key=foundation.key),
            foundation=foundation, code=code, consumer_class=f"jobs.consumers:{consumer}",
            namespace=NAMESPACE, idempotent=given)
    # When synthesized, Then it fails on that consumer, saying the class decides
    with pytest.raises(Exception) as failure:
        app.synth()
    message = str(failure.value)
    assert f"Jobs/{consumer}" in message
    assert re.search(
        rf"{kind} idempotent={given} contradicts jobs.consumers:{consumer}, which is "
        rf"{'not ' if given else ''}idempotent .* the class decides", message), message


def test_an_argument_agreeing_with_the_class_is_accepted_with_a_deprecation_warning(
    tmp_path: Path,
) -> None:
    # Given a Lambda consumer of an idempotent class, deployed with idempotent=True as before
    _, stack, foundation, code = _jobs_stack(tmp_path)
    spec = _lambda_spec(LAMBDA["LambdaKeyed"])
    LambdaConsumer(
        stack, "LambdaKeyed", channel=Channel(stack, "Channel", spec=spec, key=foundation.key),
        foundation=foundation, code=code, consumer_class="jobs.consumers:LambdaKeyed",
        namespace=NAMESPACE, idempotent=True)
    # When synthesized, Then it synthesizes, and says the argument is derived now
    Annotations.from_stack(stack).has_warning(
        "/Jobs/LambdaKeyed", Match.string_like_regexp(
            r"LambdaConsumer idempotent= is derived from jobs.consumers:LambdaKeyed now .* "
            r"drop the argument"))
