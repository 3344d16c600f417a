"""An operator's action that ends a job for good advances what waits on it (issue 52): a dead
letter deleted from its DLQ is DELETED (`DeadLetterWorkbench.delete`, `messenger dlq delete`,
the dashboard's Delete), a scheduled job cancelled before it fired is CANCELLED
(`ScheduleStore.cancel`, `messenger schedules cancel`, the dashboard's Cancel). Both call
`Workflows.settle`. On the moto server over HTTP."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from messenger import Producer
from messenger.aws import ClientFactory
from messenger.channel import ChannelSpec
from messenger.jobs.results import Outcome, ResultStore
from messenger.jobs.schedule_store import ScheduleStore
from messenger.jobs.workflows import State, Workflows
from messenger.message import DEPENDENCIES_HEADER, META_HEADERS_ATTRIBUTE
from messenger.operations.deadletters import DeadLetterWorkbench
from messenger.operations.scheduled import cancel_scheduled
from messenger.provision import Provisioner
from messenger.settings import Settings
from tests.integration.helpers import queue_url


def _channels(settings: Settings, clients: ClientFactory, *names: str) -> list[ChannelSpec]:
    """Channels that keep results, provisioned as the CDK app would."""
    specs = [ChannelSpec(name, namespace=settings.namespace, track_status=True,
                         keep_results=True) for name in names]
    for spec in specs:
        Provisioner(clients, settings).ensure_channel(spec)
    return specs


def _producer(settings: Settings, clients: ClientFactory, channel: str) -> Producer:
    cls = type("OpsProducer", (Producer,), {"channel": channel, "track_status": True})
    return cls(settings=settings, clients=clients)


def _released(clients: ClientFactory, spec: ChannelSpec) -> dict:
    """The one message released to `spec`'s queue: its dependencies header, decoded."""
    sqs = clients.client("sqs")
    answer = sqs.receive_message(QueueUrl=queue_url(sqs, spec.queue_name),
                                 MessageAttributeNames=["All"], WaitTimeSeconds=1)
    (message,) = answer["Messages"]
    headers = json.loads(message["MessageAttributes"][META_HEADERS_ATTRIBUTE]["StringValue"])
    return json.loads(headers[DEPENDENCIES_HEADER])


def _redriven(clients: ClientFactory, spec: ChannelSpec) -> None:
    """SQS's redrive without a consumer's verdict (consumers that died on it every time):
    the job's message moved from its queue to its DLQ as it is, no outcome recorded."""
    sqs = clients.client("sqs")
    source = queue_url(sqs, spec.queue_name)
    (message,) = sqs.receive_message(QueueUrl=source, MessageAttributeNames=["All"],
                                     WaitTimeSeconds=1)["Messages"]
    sqs.send_message(QueueUrl=queue_url(sqs, spec.dlq_name), MessageBody=message["Body"],
                     MessageAttributes=message["MessageAttributes"])
    sqs.delete_message(QueueUrl=source, ReceiptHandle=message["ReceiptHandle"])


@pytest.mark.parametrize("policy", ["run", "cancel"])
def test_a_dead_letter_deleted_by_an_operator_advances_its_dependent(
        settings: Settings, clients: ClientFactory, policy: str) -> None:
    # Given a job redriven to its DLQ with no outcome (it never reached a verdict), and a job
    # on another channel waiting for it
    fetch, report = _channels(settings, clients, "op_fetch", "op_report")
    producer = _producer(settings, clients, "op_fetch")
    job = str(producer.push({"url": "s3://in/7"}))
    producer.status.flush()
    _redriven(clients, fetch)
    waiting = str(_producer(settings, clients, "op_report").push(
        "report", depends_on=[job], on_dependency_failure=policy))
    assert Workflows(clients, settings).dependencies_of(waiting).pending == {job}
    # When an operator deletes the dead letter
    assert DeadLetterWorkbench("op_fetch", settings, clients, actor="ada").delete([job]) == 1
    # Then the job's final outcome is DELETED, saying who and why it was dead-lettered
    final = ResultStore(clients, settings).get(job)
    assert final is not None and final.outcome is Outcome.DELETED
    assert final.reason.startswith("deleted from its DLQ by ada (dead-lettered: redrive")
    # And the dependent advanced: released with the failure ('run'), or cancelled naming the
    # deleted job ('cancel')
    held = Workflows(clients, settings).dependencies_of(waiting)
    assert held is not None and held.pending == frozenset()
    if policy == "run":
        assert held.state is State.RELEASED
        assert _released(clients, report)[job]["outcome"] == "deleted"
    else:
        assert held.state is State.CANCELLED
        cancelled = ResultStore(clients, settings).get(waiting)
        assert cancelled is not None and cancelled.outcome is Outcome.CANCELLED
        assert job in cancelled.reason


def test_a_dead_letter_of_a_channel_without_results_is_only_deleted(
        settings: Settings, clients: ClientFactory) -> None:
    # Given a dead letter of a channel that does not keep results
    spec = ChannelSpec("op_plain", namespace=settings.namespace, track_status=True)
    Provisioner(clients, settings).ensure_channel(spec)
    producer = _producer(settings, clients, "op_plain")
    job = str(producer.push("x"))
    producer.status.flush()
    _redriven(clients, spec)
    # When it is deleted, then no final outcome is written for it (nothing can wait on it)
    assert DeadLetterWorkbench("op_plain", settings, clients, actor="ada").delete([job]) == 1
    assert ResultStore(clients, settings).get(job) is None


def test_a_scheduled_job_cancelled_advances_its_dependent(
        settings: Settings, clients: ClientFactory) -> None:
    # Given a job due in an hour on a channel that keeps results, and a job waiting for it
    _, report = _channels(settings, clients, "op_nightly", "op_summary")
    producer = _producer(settings, clients, "op_nightly")
    job = str(producer.push({"day": "mon"}, delay=timedelta(hours=1)))
    producer.status.flush()
    waiting = str(_producer(settings, clients, "op_summary").push(
        "summary", depends_on=[job], on_dependency_failure="run"))
    assert Workflows(clients, settings).dependencies_of(waiting).state is State.HELD
    # When an operator cancels the scheduled job (the dashboard's bulk cancel)
    answer = cancel_scheduled(clients, settings, [job], "op_nightly", actor="ada")
    assert answer.result == "done", answer.summary()
    # Then it is CANCELLED for good, saying who cancelled it
    final = ResultStore(clients, settings).get(job)
    assert final is not None and final.outcome is Outcome.CANCELLED
    assert final.reason.startswith("cancelled by ada before it was due")
    # And the waiting job ran on, with the cancel in its dependencies
    assert _released(clients, report)[job]["outcome"] == "cancelled"
    assert ScheduleStore(clients, settings).list("op_nightly") == []
