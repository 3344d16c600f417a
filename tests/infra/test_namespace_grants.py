"""Every grant names this app's own resources, in every namespace (issue 50, least privilege).

The whole app as `app.py` builds it (platform, example channels and consumers, EMR pipeline),
plus the team dashboard and an HTTP API with one-time schedules, synthesized in process once
per namespace per session, cdk-nag on: the default namespace '' (cdk.json's), `shop` and
`shop-eu` (namespaces may contain '-', so `shop-*` is no boundary of `shop`).

A statement allowing an sqs, sns, dynamodb, scheduler or lambda action may name a resource with
a wildcard only when one of these holds (the Service Authorization Reference's semantics):
- the action has no resource types, so IAM knows only '*' (`NO_RESOURCE_TYPES`, listed);
- the statement carries the namespace's tag condition (`stacks.ownership`): queues and topics
  made at run time have no name known at synth, their tags are the boundary;
- the wildcard follows a '/' after an exact name: the schedules of one schedule group, a
  table's indexes;
- an event source mapping (its ARN is a UUID made at deploy) under an ArnLike condition on the
  function it invokes, named '<namespace->messenger-consumer-...'.
And no pattern (resource or ArnLike condition) matches a resource of another namespace, nor a
foreign one of the account: probed with the concrete ARNs of the other namespaces' templates.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_certificatemanager as acm

import stacks.nag
from examples.cdk import add_example_channels
from messenger.channel import TAG_MANAGED, TAG_NAMESPACE
from stacks.config import MessengerConfig
from stacks.dashboard_service import CognitoLogin
from stacks.messenger_app import build_app
from stacks.ownership import ownership_condition
from tests.docs import doc_text
from tests.infra.conftest import ACCOUNT, REGION, as_list
from tests.infra.synthesized import Synthesized, synthesize

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
NAMESPACES = ("", "shop", "shop-eu")
CERT = f"arn:aws:acm:{REGION}:{ACCOUNT}:certificate/11111111-2222-3333-4444-555555555555"
SERVICES = ("sqs", "sns", "dynamodb", "scheduler", "lambda")
#: Actions of those services that have no resource types in the Service Authorization
#: Reference: '*' is the only resource a statement can give them.
NO_RESOURCE_TYPES = frozenset({
    "sqs:ListQueues", "lambda:ListEventSourceMappings", "scheduler:ListSchedules",
    "sns:ListSubscriptions", "sns:ListTopics", "sns:Unsubscribe", "dynamodb:ListTables",
})
#: Resources of the account that belong to no namespace of the app: no grant may reach them.
FOREIGN = tuple(f"arn:aws:{kind}:{REGION}:{ACCOUNT}:{name}" for kind, name in (
    ("sqs", "payroll"), ("sqs", "payroll-dlq"), ("sqs", "payroll.fifo"), ("sns", "payroll"),
    ("dynamodb", "table/payroll"), ("scheduler", "schedule/default/payroll"),
    ("lambda", "function:payroll"), ("sqs", "messenger-payroll"),
))


def _name(namespace: str) -> str:
    return namespace or "default"


#: The cdk-nag acknowledgements of wildcard resources each app made (rule id, reason).
ACKNOWLEDGED: dict[str, list[tuple[str, str]]] = {}


@pytest.fixture(scope="session")
def apps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Synthesized]:
    """The three namespaces' apps (one synth each per session), their acknowledgements of
    wildcard resources recorded as well as applied."""
    acknowledge = stacks.nag.acknowledge
    synthesized = {}
    for namespace in NAMESPACES:
        recorded = ACKNOWLEDGED.setdefault(namespace, [])

        def recording(scope: Any, rule: str, reason: str, into: list = recorded) -> None:
            into.append((rule, reason))
            acknowledge(scope, rule, reason)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(stacks.nag, "acknowledge", recording)
            synthesized[namespace] = _synthesize(tmp_path_factory, namespace)
    return synthesized


def _synthesize(tmp_path_factory: pytest.TempPathFactory, namespace: str) -> Synthesized:
    outdir = tmp_path_factory.mktemp(f"grants-{_name(namespace)}")
    app = cdk.App(outdir=str(outdir), context=CONTEXT, builtin_cloud_formation_validation=False)
    config = MessengerConfig(namespace=namespace, account=ACCOUNT, region=REGION)
    stacks = build_app(app, config, channels=add_example_channels)
    platform, examples = stacks.platform, stacks.examples
    assert examples is not None
    platform.add_dashboard(
        certificate=acm.Certificate.from_certificate_arn(platform, "Cert", CERT),
        domain_name="messenger.example.com",
        login=CognitoLogin(domain_prefix=f"{_name(namespace)}-messenger"))
    # An API serving one queue channel and one exchange's channel, not the others
    examples.add_http_enqueue([examples.channels["orders"],
                               examples.channels["wishlist_events.mobile_events"]])
    return synthesize(app, outdir)  # build_app put cdk-nag on the app


# -- rendering ----------------------------------------------------------------------------------
def _render(value: Any) -> str:
    """A resource or condition value as a string: pseudo parameters resolved, a reference to a
    resource of the template as `<Logical>` (a concrete resource, never a wildcard)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if "Ref" in value:
            return {"AWS::Partition": "aws", "AWS::Region": REGION,
                    "AWS::AccountId": ACCOUNT, "AWS::URLSuffix": "amazonaws.com"}.get(
                value["Ref"], f"<{value['Ref']}>")
        if "Fn::Join" in value:
            delimiter, parts = value["Fn::Join"]
            return delimiter.join(_render(part) for part in parts)
        if "Fn::GetAtt" in value:
            return f"<{'.'.join(value['Fn::GetAtt'])}>"
        if "Fn::ImportValue" in value:
            return f"<import {_render(value['Fn::ImportValue'])}>"
    return f"<{json.dumps(value, sort_keys=True)}>"


def _statements(app: Synthesized) -> list[tuple[str, dict[str, Any]]]:
    """Every Allow statement of every identity policy (policies, managed policies, inline)."""
    found = []
    for stack, template in app.templates.items():
        for logical_id, resource in template["Resources"].items():
            properties = resource.get("Properties", {})
            documents = []
            if resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
                documents.append(properties["PolicyDocument"])
            if resource["Type"] == "AWS::IAM::Role":
                documents += [p["PolicyDocument"] for p in properties.get("Policies", [])]
            for document in documents:
                for statement in document["Statement"]:
                    if statement["Effect"] == "Allow":
                        found.append((f"{stack}/{logical_id}", statement))
    return found


def _our_actions(statement: dict[str, Any]) -> list[str]:
    return [a for a in as_list(statement["Action"]) if a.split(":")[0] in SERVICES]


def _matches(pattern: str, arn: str) -> bool:
    return fnmatch.fnmatchcase(arn, pattern.replace("[", "[[]"))


def _concrete_arns(app: Synthesized) -> set[str]:
    """The ARNs of this app's resources that its policies name exactly, and its functions'."""
    arns = set()
    for _, statement in _statements(app):
        for resource in as_list(statement.get("Resource", [])):
            text = _render(resource)
            if "*" not in text and "<" not in text and text.startswith("arn:aws:"):
                arns.add(text)
    named = {"AWS::SQS::Queue": ("sqs", "QueueName", ""),
             "AWS::SNS::Topic": ("sns", "TopicName", ""),
             "AWS::DynamoDB::Table": ("dynamodb", "TableName", "table/"),
             "AWS::Lambda::Function": ("lambda", "FunctionName", "function:"),
             "AWS::Scheduler::ScheduleGroup": ("scheduler", "Name", "schedule-group/")}
    for template in app.templates.values():
        for resource in template["Resources"].values():
            if resource["Type"] in named:
                service, key, kind = named[resource["Type"]]
                name = resource["Properties"].get(key)
                if isinstance(name, str):
                    arns.add(f"arn:aws:{service}:{REGION}:{ACCOUNT}:{kind}{name}")
                    if service == "scheduler":  # a schedule in the group
                        arns.add(f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/{name}/job")
    return arns


# -- the rule -----------------------------------------------------------------------------------
def _why_allowed(namespace: str, statement: dict[str, Any], resource: str) -> str | None:
    """Why a wildcard resource of a statement with our actions is legitimate, or None."""
    actions = _our_actions(statement)
    if resource == "*" and set(actions) <= NO_RESOURCE_TYPES:
        return "no resource types"
    if statement.get("Condition") == ownership_condition(namespace) or (
            _tag_conditions(statement) == _tag_conditions({"Condition": ownership_condition(
                namespace)})):
        if {a.split(":")[0] for a in actions} <= {"sqs", "sns"}:
            return "the namespace's tags"
    head = resource.split("*", 1)[0]
    if head.endswith("/") and resource.endswith("/*") and resource.count("*") == 1:
        return "within an exact name"
    if resource.endswith(":event-source-mapping:*") and actions == [
            "lambda:UpdateEventSourceMapping"]:
        functions = statement.get("Condition", {}).get("ArnLike", {}).get("lambda:FunctionArn")
        if functions:
            return "mappings of the namespace's functions"
    return None


def _tag_conditions(statement: dict[str, Any]) -> dict[str, Any]:
    """The statement's ownership part: its aws:ResourceTag keys on managed/namespace."""
    kept: dict[str, Any] = {}
    for operator, keys in statement.get("Condition", {}).items():
        for key, value in keys.items():
            if key in (f"aws:ResourceTag/{TAG_MANAGED}", f"aws:ResourceTag/{TAG_NAMESPACE}"):
                kept.setdefault(operator, {})[key] = value
    return kept


@pytest.mark.xdist_group("namespace-grants")
def test_every_app_synthesizes_cdk_nag_clean(apps: dict[str, Synthesized]) -> None:
    for namespace, app in apps.items():
        assert app.violations == [], (namespace, app.violations)


@pytest.mark.xdist_group("namespace-grants")
@pytest.mark.parametrize("namespace", NAMESPACES, ids=_name)
def test_no_wildcard_reaches_beyond_the_namespace(apps: dict[str, Synthesized],
                                                  namespace: str) -> None:
    app = apps[namespace]
    others = set().union(*(_concrete_arns(apps[n]) for n in NAMESPACES if n != namespace))
    assert len(others) > 40  # the probes: queues, topics, tables, functions of both others
    checked = 0
    for path, statement in _statements(app):
        if not _our_actions(statement):
            continue
        for resource in map(_render, as_list(statement.get("Resource", []))):
            if "*" not in resource:
                continue
            checked += 1
            why = _why_allowed(namespace, statement, resource)
            assert why is not None, (path, statement)
            if why in ("no resource types", "the namespace's tags"):
                continue
            # A name pattern: it reaches no other namespace's resource and no foreign one
            reached = sorted(a for a in (*others, *FOREIGN) if _matches(resource, a))
            assert not reached, (path, resource, reached)
        for patterns in statement.get("Condition", {}).get("ArnLike", {}).values():
            for pattern in map(_render, as_list(patterns)):
                reached = sorted(a for a in (*others, *FOREIGN) if _matches(pattern, a))
                assert not reached, (path, pattern, reached)
    assert checked >= 10


@pytest.mark.xdist_group("namespace-grants")
def test_tag_conditions_tell_every_namespace_apart(apps: dict[str, Synthesized]) -> None:
    # shop's condition requires messenger:namespace=shop (never shop-eu), the default
    # namespace's the absence of that tag, and each app uses its own
    for namespace, app in apps.items():
        conditioned = [s for _, s in _statements(app) if _tag_conditions(s)]
        assert conditioned
        for statement in conditioned:
            assert _tag_conditions(statement) == _tag_conditions(
                {"Condition": ownership_condition(namespace)}), statement
    assert ownership_condition("shop") == {"StringEquals": {
        f"aws:ResourceTag/{TAG_MANAGED}": "true", f"aws:ResourceTag/{TAG_NAMESPACE}": "shop"}}
    assert ownership_condition("") == {
        "StringEquals": {f"aws:ResourceTag/{TAG_MANAGED}": "true"},
        "Null": {f"aws:ResourceTag/{TAG_NAMESPACE}": "true"}}


def test_the_rule_refuses_what_issue_50_found() -> None:
    # The grants the review found, as the rule judges them: each one refused
    default_queues = {"Action": ["sqs:SendMessage", "sqs:TagQueue"],
                      "Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:*"}
    assert _why_allowed("", default_queues, default_queues["Resource"]) is None
    dlqs = {"Action": "sqs:ReceiveMessage", "Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:*-dlq"}
    assert _why_allowed("", dlqs, dlqs["Resource"]) is None
    shop = {"Action": "sqs:SendMessage", "Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:shop-*"}
    assert _why_allowed("shop", shop, shop["Resource"]) is None
    assert _matches(shop["Resource"], f"arn:aws:sqs:{REGION}:{ACCOUNT}:shop-eu-orders")
    # another namespace's tag condition is not this one's
    tagged = {**shop, "Condition": ownership_condition("shop-eu")}
    assert _why_allowed("shop", tagged, shop["Resource"]) is None
    # '*' for an action that has resource types
    star = {"Action": "scheduler:GetScheduleGroup", "Resource": "*"}
    assert _why_allowed("shop", star, "*") is None


@pytest.mark.xdist_group("namespace-grants")
@pytest.mark.parametrize("namespace", NAMESPACES, ids=_name)
def test_no_acknowledgement_covers_an_avoidable_wildcard(apps: dict[str, Synthesized],
                                                         namespace: str) -> None:
    # Every acknowledged wildcard resource of an sqs/sns/dynamodb/scheduler/lambda grant is
    # one the rule above allows, in every statement naming it
    app = apps[namespace]
    pseudo = {"<AWS::Region>": REGION, "<AWS::AccountId>": ACCOUNT, "<AWS::Partition>": "aws"}
    ours = []
    for rule, reason in ACKNOWLEDGED[namespace]:
        if not rule.startswith("AwsSolutions-IAM5[Resource::"):
            continue
        resource = rule.removeprefix("AwsSolutions-IAM5[Resource::").removesuffix("]")
        for token, value in pseudo.items():
            resource = resource.replace(token, value)
        naming = [s for _, s in _statements(app) if _our_actions(s)
                  and resource in map(_render, as_list(s.get("Resource", [])))]
        if not naming:
            continue  # another service's grant (S3 payload keys, ECS tasks, EMR clusters)
        ours.append(resource)
        for statement in naming:
            why = _why_allowed(namespace, statement, resource)
            assert why, (resource, reason, statement)
            if namespace and f":{namespace}-*" in resource:  # a prefix: only with the tags
                assert why == "the namespace's tags", (resource, statement)
        if resource.endswith(":*") and ":event-source-mapping:" not in resource:
            assert "aws:ResourceTag condition" in reason, reason
    # the queues' and topics' tag-conditioned grants, the schedule group, the mappings
    assert {r.split(":")[2] for r in ours if r != "*"} >= {"sqs", "sns", "scheduler", "lambda"}


@pytest.mark.xdist_group("namespace-grants")
def test_the_cdk_guide_lists_the_dashboard_roles_statements(apps: dict[str, Synthesized]) -> None:
    # Each statement of the dashboard function's role is a row of docs/cdk-guide.md's table,
    # with its actions
    guide = doc_text("docs/cdk-guide.md", "Least privilege: each role's statements")
    rows = {cell.strip(): line for line in guide.splitlines() if line.startswith("| ")
            for cell in line.split("|")[1].split(",")}
    (policy,) = [r for r in apps["shop"].templates["shop-MessengerPlatform"]["Resources"].values()
                 if r["Type"] == "AWS::IAM::Policy" and "DashboardRole" in json.dumps(
                     r["Properties"]["Roles"])]
    sids = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if "Sid" in s]
    assert len(sids) >= 14
    for statement in sids:
        row = rows.get(statement["Sid"])
        assert row is not None, statement["Sid"]
        for action in as_list(statement["Action"]):
            assert action.split(":")[1] in row, (statement["Sid"], action)


@pytest.mark.xdist_group("namespace-grants")
@pytest.mark.parametrize("namespace", NAMESPACES, ids=_name)
def test_every_queue_and_topic_carries_the_tags_the_conditions_need(
        apps: dict[str, Synthesized], namespace: str) -> None:
    # The tag conditions reach the app's own queues and topics: each is tagged
    # messenger:managed=true and with its namespace (none in the default namespace), and a
    # channel's dead-letter queues messenger:role=dlq (the dashboard's DLQ operations)
    seen = 0
    for template in apps[namespace].templates.values():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] not in ("AWS::SQS::Queue", "AWS::SNS::Topic"):
                continue
            seen += 1
            tags = {t["Key"]: t["Value"] for t in resource["Properties"].get("Tags", [])}
            assert tags.get(TAG_MANAGED) == "true", logical_id
            assert tags.get(TAG_NAMESPACE) == (namespace or None), logical_id
            name = resource["Properties"].get("QueueName", "")
            if logical_id.startswith("Channel") and "-dlq" in name:
                assert tags["messenger:role"] == "dlq", logical_id
    assert seen >= 12


def _queue_roles(app: Synthesized) -> dict[str, str]:
    """Every queue of the app by how a statement names it (`<Logical.Arn>` in its own stack, its
    ARN elsewhere): its messenger:role tag ('queue', 'dlq'; '' for the schedule DLQ)."""
    roles = {}
    for template in app.templates.values():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] != "AWS::SQS::Queue":
                continue
            tags = {t["Key"]: t["Value"] for t in resource["Properties"].get("Tags", [])}
            role = tags.get("messenger:role", "")
            roles[f"<{logical_id}.Arn>"] = role
            name = resource["Properties"].get("QueueName")
            if isinstance(name, str):  # (a queue CDK names is named by reference only)
                roles[f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"] = role
    return roles


@pytest.mark.xdist_group("namespace-grants")
@pytest.mark.parametrize("namespace", NAMESPACES, ids=_name)
def test_every_role_running_channel_code_may_read_the_channels_tracking_declaration(
        apps: dict[str, Synthesized], namespace: str) -> None:
    # A channel's track_status is the messenger:track-status tag of its queues: a producer
    # reads it at its first push, a consumer in verify mode at its start, the dashboard and
    # the HTTP API for a status answer. So every role that sends to or receives from a
    # channel's queue (Fargate tasks, Lambda consumers, the HTTP API, the EMR jobs, the
    # dashboard) may sqs:ListQueueTags that same queue, under the same condition; Scheduler's
    # roles only send (they run no code) and a DLQ's sender (a consumer forwarding) reads no tag
    app = apps[namespace]
    queue_roles = _queue_roles(app)
    checked = set()
    for template in app.templates.values():
        resources = template["Resources"]
        by_role: dict[str, list[dict[str, Any]]] = {}
        for resource in resources.values():
            if resource["Type"] == "AWS::IAM::Policy":
                for ref in resource["Properties"].get("Roles", []):
                    if isinstance(ref, dict) and "Ref" in ref:
                        by_role.setdefault(ref["Ref"], []).extend(
                            resource["Properties"]["PolicyDocument"]["Statement"])
        for role, statements in by_role.items():
            trust = json.dumps(resources[role]["Properties"]["AssumeRolePolicyDocument"])
            if "scheduler.amazonaws.com" in trust:
                continue
            readable = {(_render(r), json.dumps(s.get("Condition"), sort_keys=True))
                        for s in statements if "sqs:ListQueueTags" in as_list(s["Action"])
                        for r in as_list(s["Resource"])}
            for statement in statements:
                actions = set(as_list(statement["Action"]))
                if not actions & {"sqs:SendMessage", "sqs:ReceiveMessage"}:
                    continue
                for resource in map(_render, as_list(statement["Resource"])):
                    kind = queue_roles.get(resource)
                    if kind in ("dlq", "") or (kind is None and "*" not in resource):
                        continue  # a DLQ (or the schedule DLQ) by name
                    if kind is None and "dlq" in json.dumps(statement.get("Condition")):
                        continue  # the dashboard's DLQ operations
                    key = (resource, json.dumps(statement.get("Condition"), sort_keys=True))
                    assert key in readable, (role, resource, sorted(actions))
                    checked.add(role)
    # Fargate tasks and Lambda consumers, the HTTP API, the EMR job role, the dashboard
    assert len(checked) >= 6, checked
