"""MESSENGER_SCHEDULER_ROLE_ARN: a producer's one-time jobs are sent by the role it names (the
HTTP API's own, which reaches the API's channels only: stacks/http_enqueue.py), not by the
namespace's scheduler role, which it then neither looks up nor creates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from messenger import Producer
from messenger.channel import schedule_group_name
from messenger.settings import Settings
from tests.faults import injected


class Later(Producer):
    channel = "later"


def test_the_setting_is_read_from_the_environment() -> None:
    arn = "arn:aws:iam::123456789012:role/api-scheduler"
    assert Settings.from_env({"MESSENGER_SCHEDULER_ROLE_ARN": arn}).scheduler_role_arn == arn
    assert Settings.from_env({}).scheduler_role_arn == ""


def test_a_producer_passes_the_role_it_is_given(settings, clients) -> None:
    arn = f"arn:aws:iam::123456789012:role/{settings.namespace}-api-scheduler"
    producer = Later(settings=settings.with_changes(scheduler_role_arn=arn), clients=clients)
    calls: list[str] = []
    created: list[dict[str, Any]] = []
    with injected(clients, "before-call", lambda model, **_: calls.append(model.name)), \
            injected(clients, "provide-client-params.scheduler.CreateSchedule",
                     lambda params, **_: created.append(dict(params))):
        pushed = producer.push({"n": 1}, at=datetime.now(UTC) + timedelta(hours=2))
    assert pushed.scheduled
    (request,) = created
    assert request["Target"]["RoleArn"] == arn
    assert request["GroupName"] == schedule_group_name(settings.namespace)
    # The namespace's role is neither read nor made (GetRole / CreateRole / PutRolePolicy)
    assert not {"GetRole", "CreateRole", "PutRolePolicy"} & set(calls), calls


def test_a_role_made_at_run_time_sends_by_the_namespaces_tags(settings, clients) -> None:
    # Given auto provisioning and no scheduler role yet: the first scheduled push makes it
    producer = Later(settings=settings, clients=clients)
    assert producer.push({"n": 1}, at=datetime.now(UTC) + timedelta(hours=2)).scheduled
    iam = clients.client("iam")
    name = f"{settings.namespace}-messenger-scheduler" if settings.namespace \
        else "messenger-scheduler"
    document = iam.get_role_policy(RoleName=name, PolicyName="send-scheduled-jobs")[
        "PolicyDocument"]
    statements = document["Statement"]
    # Then every wildcard send needs the namespace's tags (a prefix would reach 'shop-eu'
    # from 'shop'), and the schedule DLQ (not tagged messenger:managed) is named exactly
    for statement in statements:
        if "*" in statement["Resource"]:
            assert statement["Resource"].endswith(":*")
            assert statement["Condition"]["StringEquals"] == {
                "aws:ResourceTag/messenger:managed": "true",
                "aws:ResourceTag/messenger:namespace": settings.namespace}
    sends = [s for s in statements if s["Action"] == "sqs:SendMessage" and "Condition" not in s]
    assert [s["Resource"].rsplit(":", 1)[1] for s in sends] == [
        f"{settings.namespace}-messenger-schedules-dlq"]
