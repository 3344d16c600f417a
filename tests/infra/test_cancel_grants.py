"""The dashboard's cancel of scheduled jobs is allowed on AWS: every request that
`ScheduleStore.cancel` really makes (recorded with botocore's `provide-client-params` hook on
the moto server, in verify mode as the dashboard runs) is allowed by the dashboard role's
statements as synthesized (`DashboardService`), evaluated as IAM does for the request's action,
resource ARN, the resource's tags and the item keys: a job sent to an exchange with two consumer
channels (the topic's subscriptions, each queue's channel tag, one TransactWriteItems of both
claims), a job on a queue with a status timeline (CANCELLED recorded), and one cancelled by its
id alone (the group's names listed). moto enforces no IAM, so this is what says the role lacks
nothing.

A TransactWriteItems is authorized item by item as the underlying PutItem (DynamoDB developer
guide, "Using IAM with DynamoDB transactions"); its dynamodb:LeadingKeys are each item's key."""

from __future__ import annotations

import fnmatch
import json
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aws_cdk as cdk
import pytest
from aws_cdk import aws_certificatemanager as acm

from messenger import MultiProducer, Producer
from messenger.aws import ClientFactory
from messenger.channel import ChannelSpec
from messenger.jobs.dedup import DedupTable
from messenger.jobs.schedule_store import ScheduleStore
from messenger.provision import Provisioner
from messenger.settings import Settings
from stacks.config import MessengerConfig
from stacks.dashboard_service import CognitoLogin
from stacks.platform_stack import PlatformStack
from tests.infra.synthesized import Synthesized, synthesize
from tests.infra.tag_conditions import PREFIX, tags_meet

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
NAMESPACE = "dcancel"
#: moto's account and the region of the test clients: the stack is synthesized there, so its
#: ARNs are the ones the requests name.
ACCOUNT, REGION = "123456789012", "us-east-1"
CERT = f"arn:aws:acm:{REGION}:{ACCOUNT}:certificate/11111111-2222-3333-4444-555555555555"
#: The partition key of each table a cancel writes with a LeadingKeys condition.
HASH_KEYS = {f"{NAMESPACE}-messenger-dedup": "dedup_key"}


@pytest.fixture(scope="module")
def statements(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The dashboard role's Allow statements, as synthesized in moto's account and region."""
    outdir = tmp_path_factory.mktemp("cancel-grants")
    app = cdk.App(outdir=str(outdir), context=CONTEXT, builtin_cloud_formation_validation=False)
    platform = PlatformStack(app, NAMESPACE, config=MessengerConfig(namespace=NAMESPACE),
                             env=cdk.Environment(account=ACCOUNT, region=REGION))
    platform.add_dashboard(
        certificate=acm.Certificate.from_certificate_arn(platform, "Cert", CERT),
        domain_name="cancel.example.com", login=CognitoLogin(domain_prefix="dcancel-messenger"))
    synthesized: Synthesized = synthesize(app, outdir)
    (function,) = [f for f in synthesized.of_type(NAMESPACE, "AWS::Lambda::Function").values()
                   if "MESSENGER_DASHBOARD_ALB_ARN" in json.dumps(f)]
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    (policy,) = [r for r in synthesized.of_type(NAMESPACE, "AWS::IAM::Policy").values()
                 if {"Ref": role} in r["Properties"]["Roles"]]
    found = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
             if s["Effect"] == "Allow"]
    assert not [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
                if s["Effect"] != "Allow"]  # (no Deny to evaluate)
    return found


# -- IAM, as far as these requests need it -------------------------------------------------------
def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if "Ref" in value:
        pseudo = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT}
        return pseudo.get(value["Ref"], f"<{value['Ref']}>")
    if "Fn::Join" in value:
        delimiter, parts = value["Fn::Join"]
        return delimiter.join(_render(part) for part in parts)
    return f"<{json.dumps(value)}>"  # another resource's reference: never one of these ARNs


class Request:
    """One authorization IAM makes: action, resource ARN, the resource's tags, and the
    request's dynamodb keys (LeadingKeys) and attributes, where it has them."""

    def __init__(self, action: str, resource: str, tags: dict[str, str] | None = None,
                 leading_keys: list[str] | None = None,
                 attributes: list[str] | None = None) -> None:
        self.action, self.resource, self.tags = action, resource, tags or {}
        self.leading_keys, self.attributes = leading_keys, attributes

    def __repr__(self) -> str:
        return f"{self.action} on {self.resource} (keys {self.leading_keys})"


def _meets(condition: dict[str, dict[str, Any]], request: Request) -> bool:
    tag_tests: dict[str, dict[str, Any]] = {}
    for operator, keys in condition.items():
        for key, expected in keys.items():
            if key.startswith(PREFIX):
                tag_tests.setdefault(operator, {})[key] = expected
                continue
            values = {"dynamodb:LeadingKeys": request.leading_keys,
                      "dynamodb:Attributes": request.attributes}.get(key)
            if values is None:
                return False  # a key this request does not give: not met (conservative)
            wanted = _list(expected)
            if operator == "ForAllValues:StringLike":
                ok = all(any(fnmatch.fnmatchcase(v, w) for w in wanted) for v in values)
            elif operator == "ForAllValues:StringEquals":
                ok = all(v in wanted for v in values)
            elif operator == "ForAllValues:StringNotEquals":
                ok = all(v not in wanted for v in values)
            else:
                return False
            if not ok:
                return False
    return tags_meet(tag_tests, request.tags)


def allowed(statements: list[dict[str, Any]], request: Request) -> bool:
    for statement in statements:
        if not any(fnmatch.fnmatchcase(request.action, a) for a in _list(statement["Action"])):
            continue
        if not any(fnmatch.fnmatchcase(request.resource, _render(r))
                   for r in _list(statement["Resource"])):
            continue
        if _meets(statement.get("Condition", {}), request):
            return True
    return False


# -- the requests a cancel makes ---------------------------------------------------------------
def _table(name: str) -> str:
    return f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}"


def _leading(table: str, key: dict[str, Any]) -> list[str] | None:
    name = HASH_KEYS.get(table)
    return [str(next(iter(key[name].values())))] if name and name in key else None


def _requests(service: str, operation: str, params: dict[str, Any],
              reader: ClientFactory) -> list[Request]:
    """The authorizations IAM makes for one API request (`reader`, not recorded, reads the
    resource's tags)."""
    action = f"{service}:{operation}"
    if service == "scheduler":
        if operation == "ListSchedules":
            return [Request(action, "*")]
        return [Request(action, f"arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule/"
                                f"{params['GroupName']}/{params['Name']}")]
    if service == "sns":
        arn = params["TopicArn"]
        tags = {t["Key"]: t["Value"] for t in reader.client("sns").list_tags_for_resource(
            ResourceArn=arn).get("Tags", [])}
        return [Request(action, arn, tags)]
    if service == "sqs":
        sqs = reader.client("sqs")
        if "QueueUrl" in params:
            url = params["QueueUrl"]
            name = urlparse(url).path.rstrip("/").rsplit("/", 1)[-1]
        else:
            name = params["QueueName"]
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        owner = params.get("QueueOwnerAWSAccountId", ACCOUNT)
        tags = sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
        return [Request(action, f"arn:aws:sqs:{REGION}:{owner}:{name}", tags)]
    if service == "dynamodb":
        if operation == "TransactWriteItems":
            found = []
            for item in params["TransactItems"]:
                ((kind, write),) = item.items()
                assert kind == "Put", kind  # (a cancel's transaction: Puts only)
                found += _requests(service, "PutItem", write, reader)
            return found
        if operation == "BatchWriteItem":
            return [Request("dynamodb:BatchWriteItem", _table(t)) for t in params["RequestItems"]]
        table = params["TableName"]
        key = params.get("Key") or params.get("Item") or {}
        attributes = sorted(params["Item"]) if "Item" in params else None
        return [Request(action, _table(table), leading_keys=_leading(table, key),
                        attributes=attributes)]
    raise AssertionError(f"a cancel called {action}: map it to its IAM authorization here")


class Alerts(MultiProducer):
    channel = "alerts"


class Reminders(Producer):
    channel = "reminders"
    track_status = True


def test_every_request_of_a_cancel_is_allowed_to_the_dashboard_role(
        statements: list[dict[str, Any]], endpoint: str) -> None:
    # Given the namespace as deployed: an exchange with two consumer channels, a queue channel
    # that tracks status, the dedup table; three jobs due in an hour
    made = Settings.from_env(namespace=NAMESPACE, retry_budget_seconds=5.0)
    setup = ClientFactory(REGION)
    for name in ("alerts.mail", "alerts.sms"):
        Provisioner(setup, made).ensure_channel(ChannelSpec(name, namespace=NAMESPACE))
    DedupTable(setup, made).ensure()
    exchange_job = Alerts(settings=made, clients=setup).push({"n": 1}, delay=timedelta(hours=1))
    reminders = Reminders(settings=made, clients=setup)
    queue_job = reminders.push({"n": 2}, delay=timedelta(hours=1))
    unnamed_job = reminders.push({"n": 3}, delay=timedelta(hours=1))
    reminders.status.close()

    # When the dashboard (verify mode, clients of its own) cancels them, every request recorded
    dashboard = Settings.from_env(namespace=NAMESPACE, provisioning="verify",
                                  retry_budget_seconds=5.0)
    clients = ClientFactory(REGION)
    calls: list[tuple[str, str, dict[str, Any]]] = []

    def record(model: Any, params: dict[str, Any], **_: Any) -> None:
        calls.append((model.service_model.endpoint_prefix, model.name, dict(params)))

    clients.register("provide-client-params", record)
    store = ScheduleStore(clients, dashboard)
    assert store.cancel(exchange_job, "alerts", actor="ada").job_id == exchange_job
    assert store.cancel(queue_job, "reminders", actor="ada").job_id == queue_job
    assert store.cancel(unnamed_job, actor="ada").job_id == unnamed_job

    # Then each is allowed by the role's statements, as IAM evaluates them
    operations = {(service, operation) for service, operation, _ in calls}
    # (the paths this test means to cover were taken)
    assert {("sns", "ListSubscriptionsByTopic"), ("sqs", "ListQueueTags"),
            ("dynamodb", "TransactWriteItems"), ("dynamodb", "PutItem"),
            ("scheduler", "DeleteSchedule"), ("scheduler", "ListSchedules"),
            ("dynamodb", "Query")} <= operations, operations
    reader = ClientFactory(REGION)
    refused = [request for service, operation, params in calls
               for request in _requests(service, operation, params, reader)
               if not allowed(statements, request)]
    assert refused == []
    # And the evaluation refuses what the role does not allow (the same requests elsewhere)
    other = Request("sns:ListSubscriptionsByTopic", f"arn:aws:sns:{REGION}:{ACCOUNT}:x",
                    {"messenger:managed": "true", "messenger:namespace": f"{NAMESPACE}-eu",
                     "messenger:role": "topic"})
    assert not allowed(statements, other)
    producer_claim = Request("dynamodb:PutItem", _table(f"{NAMESPACE}-messenger-dedup"),
                             leading_keys=["orders@m-1"], attributes=["dedup_key"])
    assert not allowed(statements, producer_claim)
