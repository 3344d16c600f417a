"""A pause survives a deploy that undoes its tag and its Lambda mapping (local endpoint): the
record in the worker registry stays, and the queue alarm's pass puts the tag back and disables
the mapping again, saying so in its report (`messenger.ops.pauses`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from botocore.exceptions import ClientError

from messenger.jobs.controls import TAG_PAUSED, PauseRecords
from messenger.jobs.workers import list_workers
from messenger.operations.pause import pause, resume
from messenger.ops.pauses import reapply_pauses
from messenger.ops.queue_alarm import PauseNotReapplied, run_queue_alarm
from messenger.ops.report import queue_alarm_messages
from messenger.ops.settings import OpsSettings
from tests.integration.test_dashboard_controls import lambda_consumer
from tests.integration.test_dlq_workbench import channel


class Posts:
    """A notifier that keeps what it would post."""

    def __init__(self) -> None:
        self.messages: list[dict] = []

    def prepare(self) -> None:
        pass

    def post(self, message: dict) -> bool:
        self.messages.append(message)
        return True


def _deploy_undoes_the_pause(sqs, awslambda, url: str, mapping: str) -> None:
    # What CloudFormation may do: set the template's tags (without messenger:paused) and
    # leave a replaced mapping enabled.
    sqs.untag_queue(QueueUrl=url, TagKeys=[TAG_PAUSED])
    awslambda.update_event_source_mapping(UUID=mapping, Enabled=True)


def test_a_pause_undone_by_a_deploy_is_put_back(settings, clients):
    # Given a paused channel with a Lambda consumer
    queue = channel(settings, clients).queue
    sqs, awslambda = clients.client("sqs"), clients.client("lambda")
    mapping = lambda_consumer(clients, queue.arn)
    done = pause(clients, settings, "orders", actor="ada@example.com")
    assert done.ok, done.summary()
    (record,) = PauseRecords(clients, settings).all()
    assert (record.queue, record.channel, record.mark.by) == (queue.name, "orders",
                                                                 "ada@example.com")
    # (the record is no worker)
    assert list_workers(clients, settings) == []
    # When a deploy removes the tag and enables the mapping
    _deploy_undoes_the_pause(sqs, awslambda, queue.url, mapping)
    # Then the record still holds the pause
    assert PauseRecords(clients, settings).get(queue.name) == record.mark
    # And a pass puts the tag back and disables the mapping again, naming both and whose pause
    reapplied = reapply_pauses(clients, settings)
    assert reapplied.errors == [] and reapplied.checked == [queue.name]
    assert len(reapplied.repaired) == 2
    assert all("paused by ada@example.com" in line for line in reapplied.repaired)
    assert f"Lambda mapping {mapping}" in reapplied.repaired[1]
    tags = sqs.list_queue_tags(QueueUrl=queue.url)["Tags"]
    assert tags[TAG_PAUSED] == record.mark.tag_value()
    assert awslambda.get_event_source_mapping(UUID=mapping)["State"] == "Disabled"
    # And a second pass finds nothing to put back
    assert reapply_pauses(clients, settings).repaired == []
    # When the operator resumes, the record goes, and a pass leaves the channel running
    assert resume(clients, settings, "orders", actor="ada@example.com").ok
    assert PauseRecords(clients, settings).all() == []
    assert reapply_pauses(clients, settings).checked == []
    assert awslambda.get_event_source_mapping(UUID=mapping)["State"] == "Enabled"
    assert TAG_PAUSED not in (sqs.list_queue_tags(QueueUrl=queue.url).get("Tags") or {})


def test_the_queue_alarm_puts_a_pause_back_and_says_so(settings, clients):
    # Given a paused channel whose tag a deploy removed (no queue over its threshold)
    queue = channel(settings, clients).queue
    sqs = clients.client("sqs")
    assert pause(clients, settings, "orders", actor="ada@example.com").ok
    sqs.untag_queue(QueueUrl=queue.url, TagKeys=[TAG_PAUSED])
    posts = Posts()
    # When the 15-minute queue alarm runs
    ops = OpsSettings(slack_webhook_secret="unused", namespace=settings.namespace)
    outcome = run_queue_alarm({"scope": "source"}, clients, ops, posts, now=datetime.now(UTC))
    # Then the tag is back, and its report says what it put back and whose pause it is
    assert TAG_PAUSED in sqs.list_queue_tags(QueueUrl=queue.url)["Tags"]
    mark = PauseRecords(clients, settings).get(queue.name)
    assert outcome.summary()["pauses_reapplied"] == [
        f"{queue.name}: tag {TAG_PAUSED} put back (orders {mark})"]
    assert outcome.metrics()["PausesReapplied"] == 1
    text = str(queue_alarm_messages(outcome.report))
    assert "A deploy had undone a pause: put back" in text and "messenger resume" in text
    assert outcome.posted and posts.messages
    # And the DLQ pass (every 12 hours) does not touch pauses
    dlq = run_queue_alarm({"scope": "dlq"}, clients, ops, Posts(), now=datetime.now(UTC))
    assert dlq.report.pauses_reapplied == ()


def test_a_pause_the_alarm_cannot_put_back_fails_its_invocation(settings, clients):
    # Given a paused channel whose tag a deploy removed, and SQS refusing the alarm's TagQueue
    queue = channel(settings, clients).queue
    sqs = clients.client("sqs")
    assert pause(clients, settings, "orders", actor="ada@example.com").ok
    sqs.untag_queue(QueueUrl=queue.url, TagKeys=[TAG_PAUSED])

    def refuse(**_: object) -> None:
        raise ClientError({"Error": {"Code": "AccessDenied", "Message": "not allowed"}},
                          "TagQueue")

    sqs.meta.events.register("before-call.sqs.TagQueue", refuse)
    posts = Posts()
    ops = OpsSettings(slack_webhook_secret="unused", namespace=settings.namespace)
    # When the queue alarm runs
    outcome = run_queue_alarm({"scope": "source"}, clients, ops, posts, now=datetime.now(UTC))
    sqs.meta.events.unregister("before-call.sqs.TagQueue", refuse)
    # Then its report names the pause it could not put back, and the invocation fails (the
    # ops alarm wakes someone: that channel may be consuming), after the report was posted
    [error] = outcome.summary()["pause_errors"]
    assert queue.name in error and "AccessDenied" in error
    assert outcome.metrics()["PauseErrors"] == 1
    assert outcome.posted and "not put back" in str(posts.messages)
    with pytest.raises(PauseNotReapplied, match="could not put back 1 pause"):
        outcome.raise_for_failure()
