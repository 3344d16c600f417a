"""Flow control in the CDK: a channel's `max_concurrency` as its Lambda event sources'
MaximumConcurrency or provisioned mode, the concurrency cap each consumer is told, the limits
table and its grants (one in-process synth per session, plus construction errors)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs

from messenger.channel import ChannelSpec, limits_table_name
from messenger.jobs import limits as runtime_limits
from stacks.channel import Channel
from stacks.consumer_service import ConsumerService
from stacks.flow_control import CONCURRENCY_CAP_VARIABLE, METRIC_NAMESPACE
from stacks.foundation import Foundation
from stacks.lambda_consumer import LambdaConsumer
from tests.infra.conftest import ACCOUNT, REGION, as_list
from tests.infra.test_validation import PLATFORM_CLUSTER, _app

NAMESPACE = "flow"
#: A team's folder `team/`: one class per channel.
CONSUMERS = '''
from messenger import Consumer


class Job(Consumer):
    processing_timeout = 10
    visibility_timeout = 120

    def handler(self, message):
        pass


class Capped(Job):
    channel = "capped"


class Provisioned(Job):
    channel = "provisioned"


class Levels(Job):
    channel = "levels"
    priorities = ("high", "low")


class Plain(Job):
    channel = "plain"
'''


def _spec(name: str, **options: Any) -> ChannelSpec:
    # 6 x the function's timeout (10 s + 3 s to finish) fits in the visibility timeout
    return ChannelSpec(name, namespace=NAMESPACE, visibility_timeout=120, **options)


@dataclass
class Synthesized:
    resources: dict[str, Any]
    ids: dict[str, str]  # construct id -> the logical id of its function or task definition
    roles: dict[str, str]  # construct id -> its role's logical id


@pytest.fixture(scope="session")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    """Given one stack: `capped` (max_concurrency 20) run by a Lambda consumer and two Fargate
    services, `provisioned` (max_concurrency 50) by a Lambda consumer in provisioned mode,
    `levels` (max_concurrency 1, two priority levels) by a Lambda consumer."""
    root = tmp_path_factory.mktemp("flow")
    code = root / "team"
    code.mkdir()
    (code / "consumers.py").write_text(CONSUMERS)
    app = _app(root / "out")
    stack = cdk.Stack(app, "Flow", env=cdk.Environment(account=ACCOUNT, region=REGION))
    foundation = Foundation(stack, "Foundation", namespace=NAMESPACE)
    channels = {
        name: Channel(stack, f"{name}Channel", spec=spec, key=foundation.key)
        for name, spec in {
            "capped": _spec("capped", max_concurrency=20),
            "provisioned": _spec("provisioned", max_concurrency=50),
            "levels": _spec("levels", max_concurrency=1, priorities=("high", "low")),
            "plain": _spec("plain"),
        }.items()
    }
    cluster = ecs.Cluster(stack, "Cluster", vpc=ec2.Vpc(
        stack, "Vpc", nat_gateways=0, availability_zones=["eu-west-1a"]), **PLATFORM_CLUSTER)
    built: dict[str, Any] = {
        "CappedLambda": LambdaConsumer(
            stack, "CappedLambda", channel=channels["capped"], foundation=foundation,
            code=code, consumer_class="team.consumers:Capped", namespace=NAMESPACE),
        "ProvisionedLambda": LambdaConsumer(
            stack, "ProvisionedLambda", channel=channels["provisioned"], foundation=foundation,
            code=code, consumer_class="team.consumers:Provisioned", namespace=NAMESPACE,
            min_pollers=5, max_pollers=50),
        "LevelsLambda": LambdaConsumer(
            stack, "LevelsLambda", channel=channels["levels"], foundation=foundation,
            code=code, consumer_class="team.consumers:Levels", namespace=NAMESPACE),
        "PlainLambda": LambdaConsumer(
            stack, "PlainLambda", channel=channels["plain"], foundation=foundation,
            code=code, consumer_class="team.consumers:Plain", namespace=NAMESPACE),
    }
    for name, tasks, workers in (("CappedFargate1", 4, 2), ("CappedFargate2", 2, 1)):
        built[name] = ConsumerService(
            stack, name, channel=channels["capped"], foundation=foundation, cluster=cluster,
            image=ecs.ContainerImage.from_registry("public.ecr.aws/docker/library/python:3.11"),
            consumer_class="team.consumers:Capped", namespace=NAMESPACE,
            max_tasks=tasks, concurrency=workers)
    resources = app.synth().get_stack_by_name("Flow").template["Resources"]

    def logical(construct: Any) -> str:
        return stack.get_logical_id(construct.node.default_child)

    ids = {name: logical(getattr(built[name], "function", None)
                         or getattr(built[name], "task_definition", None))
           for name in built}
    roles = {name: logical(getattr(built[name], "role", None)
                           or built[name].task_definition.task_role) for name in built}
    return Synthesized(resources, ids, roles)


def _mappings(flow: Synthesized, name: str) -> list[dict[str, Any]]:
    return [r["Properties"] for r in flow.resources.values()
            if r["Type"] == "AWS::Lambda::EventSourceMapping"
            and r["Properties"]["FunctionName"] == {"Ref": flow.ids[name]}]


def _cap(flow: Synthesized, name: str) -> str:
    properties = flow.resources[flow.ids[name]]["Properties"]
    if "Environment" in properties:  # a function
        variables = properties["Environment"]["Variables"]
    else:  # a task definition
        (container,) = properties["ContainerDefinitions"]
        variables = {e["Name"]: e["Value"] for e in container["Environment"]}
    return variables[CONCURRENCY_CAP_VARIABLE]


def test_a_channels_max_concurrency_is_its_event_sources_maximum_concurrency(
    flow: Synthesized,
) -> None:
    (mapping,) = _mappings(flow, "CappedLambda")
    assert mapping["ScalingConfig"] == {"MaximumConcurrency": 20}
    assert "ProvisionedPollerConfig" not in mapping


def test_provisioned_mode_sets_the_pollers_and_no_maximum_concurrency(flow: Synthesized) -> None:
    (mapping,) = _mappings(flow, "ProvisionedLambda")
    assert mapping["ProvisionedPollerConfig"] == {"MinimumPollers": 5, "MaximumPollers": 50}
    assert "ScalingConfig" not in mapping
    # The event source does not bound the handlers: the consumer is told no cap (its lease
    # holds the channel's max_concurrency)
    assert _cap(flow, "ProvisionedLambda") == ""


def test_a_limit_below_two_per_level_still_bounds_each_event_source(flow: Synthesized) -> None:
    # Given max_concurrency 1 over two priority levels: AWS's least MaximumConcurrency is 2
    mappings = _mappings(flow, "LevelsLambda")
    assert [m["ScalingConfig"] for m in mappings] == [{"MaximumConcurrency": 2}] * 2
    # Then the consumer is told 4 handlers may run (above 1: it takes the shared lease)
    assert _cap(flow, "LevelsLambda") == "4"


def test_every_consumer_of_a_channel_is_told_the_cap_of_all_of_them(flow: Synthesized) -> None:
    # 20 (Lambda) + 4 tasks x 2 workers + 2 tasks x 1 worker: 30 > max_concurrency 20
    assert {_cap(flow, name) for name in ("CappedLambda", "CappedFargate1", "CappedFargate2")} \
        == {"30"}


def test_the_limits_table_is_keyed_by_key_with_ttl_and_recovery(flow: Synthesized) -> None:
    (table,) = [r["Properties"] for r in flow.resources.values()
                if r["Type"] == "AWS::DynamoDB::Table"
                and r["Properties"]["TableName"] == limits_table_name(NAMESPACE)]
    assert table["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert table["SSESpecification"]["SSEEnabled"] is True
    assert table["BillingMode"] == "PAY_PER_REQUEST"


def _policy_statements(flow: Synthesized, name: str) -> list[dict[str, Any]]:
    (policy,) = [r for r in flow.resources.values() if r["Type"] == "AWS::IAM::Policy"
                 and {"Ref": flow.roles[name]} in r["Properties"]["Roles"]]
    return list(policy["Properties"]["PolicyDocument"]["Statement"])


def _limits_statements(flow: Synthesized, name: str) -> list[dict[str, Any]]:
    table = f"table/{limits_table_name(NAMESPACE)}"
    return [s for s in _policy_statements(flow, name) if table in json.dumps(s["Resource"])]


@pytest.mark.parametrize(("name", "channel"), [
    ("CappedLambda", "capped"), ("CappedFargate1", "capped"), ("LevelsLambda", "levels")])
def test_a_consumer_may_touch_only_its_own_channels_limit_items(
    flow: Synthesized, name: str, channel: str,
) -> None:
    statements = _limits_statements(flow, name)
    by_actions = {tuple(sorted(as_list(s["Action"]))): s for s in statements}
    # and its flow-control metrics, in their namespace only
    (metrics,) = [s for s in _policy_statements(flow, name)
                  if "cloudwatch:PutMetricData" in as_list(s["Action"])]
    assert metrics["Resource"] == "*" and metrics["Condition"] == {
        "StringEquals": {"cloudwatch:namespace": METRIC_NAMESPACE}}
    assert set(by_actions) == {
        ("dynamodb:DescribeTable",),
        ("dynamodb:GetItem", "dynamodb:UpdateItem")}
    items = by_actions[("dynamodb:GetItem", "dynamodb:UpdateItem")]
    assert items["Condition"] == {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [
        f"limits#{channel}", f"rate#{channel}", f"rate#{channel}#tenant#*",
        f"concurrency#{channel}", f"report#{channel}"]}}
    # the table by its ARN, no index, no wildcard
    assert all(not json.dumps(s["Resource"]).endswith('*"') for s in statements)


def test_a_consumer_of_a_channel_without_limits_gets_no_limits_table(flow: Synthesized) -> None:
    # (its consumers run no limit gate: no limit set at run time is read for it)
    assert _limits_statements(flow, "PlainLambda") == []
    assert not any("cloudwatch:PutMetricData" in as_list(s["Action"])
                   for s in _policy_statements(flow, "PlainLambda"))
    (mapping,) = _mappings(flow, "PlainLambda")
    assert "ScalingConfig" not in mapping and "ProvisionedPollerConfig" not in mapping


@pytest.mark.parametrize(("options", "error"), [
    ({"max_concurrency": 10, "min_pollers": 2},
     r"max_concurrency and provisioned mode \(min_pollers, max_pollers\) cannot be set at "
     r"once: AWS takes either ScalingConfig.MaximumConcurrency or ProvisionedPollerConfig"),
    ({"min_pollers": 1}, "min_pollers must be from 2 to 200, got 1"),
    ({"min_pollers": 201}, "min_pollers must be from 2 to 200, got 201"),
    ({"max_pollers": 2001}, "max_pollers must be from 2 to 2000, got 2001"),
    ({"min_pollers": 20, "max_pollers": 10}, r"min_pollers \(20\) must not exceed max_pollers "
                                             r"\(10\)"),
    ({"max_concurrency": 1001}, "max_concurrency must be from 2 to 1000, got 1001"),
])
def test_event_source_scaling_out_of_range_or_both_modes_fails_naming_the_field(
    tmp_path: Path, options: dict[str, Any], error: str,
) -> None:
    app = _app(tmp_path)
    stack = cdk.Stack(app, "Small", env=cdk.Environment(account=ACCOUNT, region=REGION))
    foundation = Foundation(stack, "Foundation", namespace="")
    channel = Channel(stack, "Channel", spec=ChannelSpec("q", visibility_timeout=150),
                      key=foundation.key)
    with pytest.raises(ValueError, match=r"LambdaConsumer 'Consumer': " + error):
        LambdaConsumer(stack, "Consumer", channel=channel, foundation=foundation,
                       code=Path(__file__).resolve().parents[2] / "examples",
                       consumer_class="examples.wishlist:ReceiptsConsumer", namespace="",
                       **options)


def test_the_grants_cover_every_key_the_store_uses_and_no_other_channels(
    settings: Any, clients: Any,
) -> None:
    # Given every item request the flow-control store makes for 'orders' on the moto server
    # (an operator's change, the consumers' limiters, the channel's and a tenant's, their
    # report, a concurrency lease taken and renewed), recorded on the wire
    from fnmatch import fnmatchcase

    from messenger.channel import Rate
    from messenger.jobs.limits import ConcurrencyLease, LimitStore, RateLimiter, rate_key
    from stacks.flow_control import LIMITS_RECORD_PREFIX, channel_keys

    calls: list[tuple[str, str]] = []

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        if "Key" in params:
            calls.append((model.name, params["Key"]["key"]["S"]))

    clients.register("provide-client-params", record)
    store = LimitStore(clients, settings)
    store.ensure()
    store.set("orders", rate_limit="10/s", by="ada")  # the operator's
    operator = list(calls)
    store.get("orders")
    assert RateLimiter(store, rate_key("orders"), Rate(10, 1)).take() is not None
    assert RateLimiter(store, rate_key("orders", "acme"), Rate(2, 1), tenant=True).take() \
        is not None
    store.report("orders", "p1", 1.0, 0)
    lease = ConcurrencyLease(store, "orders", "p1")
    assert lease.acquire(limit=3, want=2) == 2
    lease.acquire(limit=3, want=1)  # a renewal, resized
    consumer = calls[len(operator):]
    # (only the actions the consumers are granted)
    assert {name for name, _ in consumer} == {"GetItem", "UpdateItem"}
    assert {key for _, key in consumer} == {
        "limits#orders", "rate#orders", "rate#orders#tenant#acme", "concurrency#orders",
        "report#orders"}

    # Then the consumer's LeadingKeys patterns allow each key, and no key of 'orders-eu' (a
    # channel whose name starts with 'orders'), nor the operator's
    def allowed(key: str, patterns: list[str]) -> bool:
        return any(fnmatchcase(key, pattern) for pattern in patterns)

    patterns = channel_keys(_spec("orders"))
    assert all(allowed(key, patterns) for _, key in consumer), consumer
    other = channel_keys(_spec("orders-eu"))
    assert not any(allowed(key, other) for _, key in calls)
    # And an operator writes only limits records, which no consumer limiter or report is
    writes = [(name, key) for name, key in operator if name != "GetItem"]
    assert writes == [("UpdateItem", f"{LIMITS_RECORD_PREFIX}orders")]
    assert not any(key.startswith(LIMITS_RECORD_PREFIX) for name, key in consumer
                   if name != "GetItem")


def test_the_operators_policy_allows_every_call_of_messenger_limits(
    settings: Any, clients: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path,
) -> None:
    # Given the operators' managed policy as synthesized, and 'orders' declaring a rate limit
    from fnmatch import fnmatchcase

    from aws_cdk.assertions import Template

    from messenger.jobs.limits import LimitStore
    from messenger.provision import Provisioner
    from messenger.tools import cli
    from messenger.tools.runtime import CommandRuntime
    from stacks.flow_control import LimitOperators

    stack = cdk.Stack(_app(tmp_path), "Operators",
                      env=cdk.Environment(account=ACCOUNT, region=REGION))
    foundation = Foundation(stack, "Foundation", namespace=settings.namespace)
    operators = LimitOperators(stack, "LimitOperators", namespace=settings.namespace,
                               key=foundation.key)
    (policy,) = [p for p in Template.from_stack(stack).find_resources(
        "AWS::IAM::ManagedPolicy").values() if p["Properties"]["ManagedPolicyName"] ==
        f"{settings.namespace}-messenger-limit-operators"]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert operators.policy is not None
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        "orders", namespace=settings.namespace, rate_limit="50/s"))
    LimitStore(clients, settings).ensure()  # as the platform stack made it

    # When an operator runs `messenger limits set` and `show`, every request recorded
    calls: list[tuple[str, str | None]] = []
    prefixes = {"tagging": "tag"}

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        service = model.service_model.endpoint_prefix
        key = params.get("Key", {}).get("key", {}).get("S")
        calls.append((f"{prefixes.get(service, service)}:{model.name}", key))

    def runtime(*_: Any, **__: Any) -> CommandRuntime:
        clients.register("provide-client-params", record)
        return CommandRuntime(settings, clients)

    monkeypatch.setattr(CommandRuntime, "from_env", runtime)
    assert cli.main(["limits", "set", "orders", "--rate", "10/s", "--as", "ada"]) == 0
    assert cli.main(["limits", "show", "orders"]) == 0
    capsys.readouterr()

    # Then each is allowed by a statement of the policy, its item keys by the condition
    def allows(statement: dict[str, Any], action: str, key: str | None) -> bool:
        if action not in as_list(statement["Action"]):
            return False
        patterns = statement.get("Condition", {}).get("ForAllValues:StringLike", {}).get(
            "dynamodb:LeadingKeys")
        return patterns is None or (key is not None and any(
            fnmatchcase(key, pattern) for pattern in as_list(patterns)))

    assert {action for action, _ in calls} >= {
        "tag:GetResources", "dynamodb:UpdateItem", "dynamodb:GetItem"}
    refused = [(a, k) for a, k in calls if not any(allows(s, a, k) for s in statements)]
    assert not refused


def test_a_class_declaring_other_limits_than_its_channel_fails_synthesis(tmp_path: Path) -> None:
    # Given a class declaring 10/s per channel (600/min is the same) and 5 at once, deployed
    # for a channel declaring 600/min and no max_concurrency
    code = tmp_path / "team"
    code.mkdir()
    (code / "jobs.py").write_text(
        "from messenger import Consumer\n"
        "class Jobs(Consumer):\n"
        "    channel = 'jobs'\n"
        "    visibility_timeout = 150\n"
        "    processing_timeout = 10\n"
        "    rate_limit = '10/s'\n"
        "    max_concurrency = 5\n"
        "    def handler(self, message): pass\n"
    )
    app = _app(tmp_path / "out")
    stack = cdk.Stack(app, "Small", env=cdk.Environment(account=ACCOUNT, region=REGION))
    foundation = Foundation(stack, "Foundation", namespace="")
    channel = Channel(stack, "Channel", key=foundation.key, spec=ChannelSpec(
        "jobs", visibility_timeout=150, rate_limit="600/min"))
    LambdaConsumer(stack, "Consumer", channel=channel, foundation=foundation, code=code,
                   consumer_class="team.jobs:Jobs", namespace="")
    # When synthesized, Then the one disagreement is named (the equal rate is not)
    with pytest.raises(Exception) as failure:
        app.synth()
    message = str(failure.value)
    assert "declares max_concurrency=5 but is deployed for channel 'jobs' with " \
           "max_concurrency=None" in message
    assert "rate_limit" not in message


@pytest.mark.parametrize(("limit", "levels", "given", "expected"), [
    (20, (), None, (20, 20)),           # one queue: N itself, no lease
    (1, (), None, (2, 2)),              # AWS's least is 2: the lease makes it 1
    (5000, (), None, (1000, 1000)),     # at most 1,000 a source: within N, no lease
    (10, ("high", "low"), None, (5, 10)),
    (3, ("high", "low"), None, (2, 4)),  # N < 2k: above N, the lease holds it
    (None, (), None, (None, None)),     # no limit: no bound
    (None, (), 7, (7, 7)),              # the construct's own
    (10, ("high", "low"), 8, (8, 16)),  # given above N's share: the lease holds N
])
def test_each_event_source_gets_its_share_of_the_channels_max_concurrency(
    tmp_path: Path, limit: int | None, levels: tuple[str, ...], given: int | None,
    expected: tuple[int | None, int | None],
) -> None:
    from stacks.lambda_consumer import EventSourceScaling

    stack = cdk.Stack(_app(tmp_path), "Small")
    foundation = Foundation(stack, "Foundation", namespace="")
    channel = Channel(stack, "Channel", key=foundation.key, spec=ChannelSpec(
        "q", max_concurrency=limit, priorities=levels))
    scaling = EventSourceScaling.of("LambdaConsumer 'C'", channel, given, None, None)
    assert (scaling.max_concurrency, scaling.cap) == expected
    assert scaling.pollers is None


def test_the_stacks_name_the_runtimes_metric_namespace_and_cap_variable() -> None:
    from messenger.consume import limits as gate

    assert METRIC_NAMESPACE == runtime_limits.METRIC_NAMESPACE
    assert CONCURRENCY_CAP_VARIABLE == gate.CONCURRENCY_CAP_VARIABLE
