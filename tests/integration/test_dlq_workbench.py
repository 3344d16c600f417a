"""The dead-letter workbench reads a channel's DLQs without losing, duplicating or hiding a
message, shows the consumer's verdict, and requeues or deletes exactly the letters named."""

from __future__ import annotations

import json
import time

import pytest

from messenger import ChannelSpec
from messenger.errors import ChannelNotFound, DeadLetterNotFound, InvalidSettings
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.message import (
    DEAD_LETTER_FAILURE_ATTRIBUTE,
    DEAD_LETTER_REASON_ATTRIBUTE,
    Message,
)
from messenger.offload import PayloadStore, pointer_attributes
from messenger.operations.deadletters import REDRIVE_REASON, DeadLetterWorkbench
from messenger.provision import Provisioner
from messenger.tools import cli
from tests.integration import test_consumer_runtime
from tests.integration.helpers import decode, drain

# The consumer-runtime tests' fixtures: `running(cls, **ConsumerSettings changes)`.
running = test_consumer_runtime.running
runtime = test_consumer_runtime.runtime

TRACEBACK = (
    'Traceback (most recent call last):\n  File "app.py", line 3, in handler\n'
    "    charge(order)\nValueError: card declined\n"
)


def failure(attempts: int = 3) -> str:
    return json.dumps({"error_type": "ValueError", "error_message": "card declined",
                       "traceback": TRACEBACK, "attempts": attempts,
                       "at": "2026-11-24T06:00:00Z", "consumer": "app.Charge"})


def dead_letter(sqs, url, message, reason="handler failed", group=None, verdict=True):
    """Write a dead letter as the consumer does (reason + failure record), or as SQS's redrive
    leaves it (verdict=False: the message's own attributes only)."""
    encoded = message.encode()
    attributes = dict(encoded.attributes)
    if verdict:
        attributes[DEAD_LETTER_REASON_ATTRIBUTE] = {"DataType": "String", "StringValue": reason}
        attributes[DEAD_LETTER_FAILURE_ATTRIBUTE] = {"DataType": "String",
                                                     "StringValue": failure()}
    fifo = {} if group is None else {"MessageGroupId": group,
                                     "MessageDeduplicationId": message.message_id}
    sqs.send_message(QueueUrl=url, MessageBody=encoded.body, MessageAttributes=attributes, **fifo)


def channel(settings, clients, name="orders", **spec):
    return Provisioner(clients, settings).ensure_channel(
        ChannelSpec(name, namespace=settings.namespace, **spec))


def counts(sqs, url):
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (int(attributes["ApproximateNumberOfMessages"]),
            int(attributes["ApproximateNumberOfMessagesNotVisible"]))


def test_list_shows_verdicts_and_releases_everything(settings, clients):
    # Given a DLQ with 25 consumer verdicts and one message SQS's redrive moved
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    for n in range(25):
        dead_letter(sqs, resources.dlq.url, Message({"n": n}, message_id=f"job-{n}"))
    dead_letter(sqs, resources.dlq.url, Message({"n": 99}, message_id="job-redriven"),
                verdict=False)
    # When the channel's dead letters are listed
    listing = DeadLetterWorkbench("orders", settings, clients).list()
    # Then every letter is there once, with its verdict, and all are visible again at once
    ids = sorted(letter.id for letter in listing.letters)
    assert ids == sorted([f"job-{n}" for n in range(25)] + ["job-redriven"])
    letter = next(x for x in listing.letters if x.id == "job-3")
    assert (letter.reason, letter.error_type, letter.attempts) == ("handler failed",
                                                                   "ValueError", 3)
    assert letter.traceback_line == "ValueError: card declined"
    assert next(x for x in listing.letters if x.id == "job-redriven").reason == REDRIVE_REASON
    assert listing.not_seen == 0
    assert counts(sqs, resources.dlq.url) == (26, 0)


def test_list_stops_at_limit_and_counts_what_another_reader_holds(settings, clients):
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    for n in range(12):
        dead_letter(sqs, resources.dlq.url, Message({"n": n}))
    # Given another reader holding 2 of the 12
    taken = sqs.receive_message(QueueUrl=resources.dlq.url, MaxNumberOfMessages=2,
                                VisibilityTimeout=300)["Messages"]
    assert len(taken) == 2
    bench = DeadLetterWorkbench("orders", settings, clients)
    # Then a full listing sees 10 and says 2 could not be seen
    listing = bench.list()
    assert (len(listing.letters), listing.not_seen) == (10, 2)
    assert "2 more could not be seen" in listing.summary()
    # And a limited one stops there, leaving everything as it was
    limited = bench.list(limit=4)
    assert len(limited.letters) == 4 and limited.stopped_at_limit
    assert counts(sqs, resources.dlq.url) == (10, 2)


def test_fifo_dlq_is_listed_in_order_and_says_what_group_blocking_hides(settings, clients):
    # Given an ordered channel's DLQ: group a holds 14 letters, group b 3
    resources = channel(settings, clients, ordered=True)
    sqs = clients.client("sqs")
    for n in range(14):
        dead_letter(sqs, resources.dlq.url, Message({"n": n}, message_id=f"a-{n}"), group="a")
    for n in range(3):
        dead_letter(sqs, resources.dlq.url, Message({"n": n}, message_id=f"b-{n}"), group="b")
    # When listed twice
    bench = DeadLetterWorkbench("orders", settings, clients)
    first, second = bench.list(), bench.list()
    # Then each listing shows what SQS lets it see, in the queue's order, and counts the rest
    for listing in (first, second):
        seen_a = [x.id for x in listing.letters if x.group_id == "a"]
        assert seen_a == [f"a-{n}" for n in range(len(seen_a))]
        assert [x.id for x in listing.letters if x.group_id == "b"] == ["b-0", "b-1", "b-2"]
        assert len(listing.letters) + listing.not_seen == 17
        if listing.not_seen:
            assert listing.fifo_blocked == listing.not_seen
            assert "FIFO message group" in listing.summary()
    # And nothing was lost or reordered: a drain returns all 17 in their groups' order
    raw = drain(sqs, resources.dlq.url)
    order = [decode(m).message_id for m in raw]
    assert [i for i in order if i.startswith("a-")] == [f"a-{n}" for n in range(14)]
    assert sorted(order) == sorted([f"a-{n}" for n in range(14)] + ["b-0", "b-1", "b-2"])


def test_show_resolves_the_offloaded_body_and_the_status_timeline(settings, clients):
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    provisioner = Provisioner(clients, settings)
    store = PayloadStore(clients.client("s3"), provisioner.ensure_bucket(), provisioner.key_arn())
    pointer = store.put(json.dumps({"big": "x" * 100}))
    message = Message({"ignored": True}, message_id="job-big", routing_key="ORDER.NEW")
    attributes = {**message.encode().attributes, **pointer_attributes(120),
                  DEAD_LETTER_REASON_ATTRIBUTE: {"DataType": "String", "StringValue": "failed"},
                  DEAD_LETTER_FAILURE_ATTRIBUTE: {"DataType": "String", "StringValue": failure()}}
    sqs.send_message(QueueUrl=resources.dlq.url, MessageBody=pointer.encode(),
                     MessageAttributes=attributes)
    status = StatusStore(clients, settings.with_changes(provisioning="auto"))
    status.ensure_table()
    status.record(StatusRecord("job-big", StatusEvent.FAILED, "orders", error_class="ValueError",
                               error="card declined"))
    status.close()
    letter, body, timeline = DeadLetterWorkbench("orders", settings, clients).show("job-big")
    assert body == {"big": "x" * 100}
    assert letter.routing_key == "ORDER.NEW" and letter.offloaded
    assert "ValueError: card declined" in letter.traceback
    assert [r.event for r in timeline] == [StatusEvent.FAILED]
    assert counts(sqs, resources.dlq.url) == (1, 0)


def test_a_redriven_letter_shows_the_last_recorded_error(settings, clients):
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    dead_letter(sqs, resources.dlq.url, Message({"n": 1}, message_id="job-r"), verdict=False)
    status = StatusStore(clients, settings.with_changes(provisioning="auto"))
    status.ensure_table()
    for n, error in enumerate(["first try", "second try"]):
        status.record(StatusRecord("job-r", StatusEvent.FAILED, "orders", at=time.time() + n,
                                   error_class="KeyError", error=error))
    status.close()
    [letter] = DeadLetterWorkbench("orders", settings, clients).list().letters
    assert letter.reason == REDRIVE_REASON
    assert letter.last_error == "KeyError: second try"


def test_requeue_moves_exactly_the_named_letters(settings, clients):
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    for n in range(3):
        dead_letter(sqs, resources.dlq.url, Message({"n": n}, message_id=f"job-{n}"))
    [report] = DeadLetterWorkbench("orders", settings, clients).requeue(["job-1"])
    assert (report.moved, report.failed) == (1, 0)
    moved = drain(sqs, resources.queue.url)
    assert [decode(m).message_id for m in moved] == ["job-1"]
    assert DEAD_LETTER_REASON_ATTRIBUTE not in moved[0]["MessageAttributes"]
    assert counts(sqs, resources.dlq.url) == (2, 0)
    assert sorted(decode(m).message_id for m in drain(sqs, resources.dlq.url)) == \
        ["job-0", "job-2"]


def test_priority_channel_reads_every_level_and_requeues_to_the_right_level(settings, clients):
    resources = channel(settings, clients, name="jobs", priorities=("high", "low"))
    sqs = clients.client("sqs")
    high, low = resources.levels
    dead_letter(sqs, high.dlq.url, Message({"n": 1}, message_id="urgent"))
    dead_letter(sqs, low.dlq.url, Message({"n": 2}, message_id="later"))
    bench = DeadLetterWorkbench("jobs", settings, clients)
    assert sorted(x.id for x in bench.list().letters) == ["later", "urgent"]
    bench.requeue(["later"])
    assert [decode(m).message_id for m in drain(sqs, low.queue.url)] == ["later"]
    assert drain(sqs, high.queue.url) == []


def test_delete_removes_exactly_the_named_letters(settings, clients):
    resources = channel(settings, clients, ordered=True)
    sqs = clients.client("sqs")
    for n in range(3):
        dead_letter(sqs, resources.dlq.url, Message({"n": n}, message_id=f"job-{n}"), group="g")
    assert DeadLetterWorkbench("orders", settings, clients).delete(["job-0"]) == 1
    assert [decode(m).message_id for m in drain(sqs, resources.dlq.url)] == ["job-1", "job-2"]


def test_bad_input_changes_nothing(settings, clients):
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    dead_letter(sqs, resources.dlq.url, Message({"n": 1}, message_id="job-1"))
    bench = DeadLetterWorkbench("orders", settings, clients)
    # An unknown id among known ones: nothing moved, everything visible again
    with pytest.raises(DeadLetterNotFound, match="'nope'"):
        bench.requeue(["job-1", "nope"])
    assert counts(sqs, resources.dlq.url) == (1, 0)
    assert drain(sqs, resources.queue.url) == []
    # A queue without a DLQ, and a channel that does not exist
    sqs.create_queue(QueueName=f"{settings.namespace}-plain")
    for name in ("plain", "missing"):
        with pytest.raises(ChannelNotFound, match="with a DLQ"):
            DeadLetterWorkbench(name, settings, clients)
    with pytest.raises(InvalidSettings, match="limit"):
        bench.list(limit=0)


def test_cli_one_line_errors_and_delete_needs_yes(settings, clients, monkeypatch, capsys):
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    dead_letter(sqs, resources.dlq.url, Message({"n": 1}, message_id="job-1"))
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    for argv, expected in (
        (["dlq", "show", "orders", "nope"], "no dead letter 'nope'"),
        (["dlq", "list", "plain"], "no channel 'plain'"),
        (["dlq", "delete", "orders", "job-1"], "needs --yes"),
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1, err
    assert counts(sqs, resources.dlq.url) == (1, 0)
    assert cli.main(["dlq", "list", "orders"]) == 0
    out = capsys.readouterr().out
    assert "job-1" in out and "ValueError: card declined" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert cli.main(["dlq", "show", "orders", "job-1"]) == 0
    assert TRACEBACK.strip() in capsys.readouterr().out
    assert cli.main(["dlq", "delete", "orders", "job-1", "--yes"]) == 0
    assert counts(sqs, resources.dlq.url) == (0, 0)


def test_a_consumers_dead_letter_shows_its_traceback_end_to_end(
    settings, clients, running, monkeypatch, capsys
):
    from tests.integration.test_consumer_runtime import wait_until
    from tests.integration.test_job_failures import Doomed, JobsProducer

    # Given a job pushed with max_attempts=1 and a consumer whose handler raises
    job = JobsProducer(settings=settings).push({"job": "once"}, max_attempts=1)
    run = running(Doomed, retry_delay=0)
    sqs = clients.client("sqs")
    dlq = sqs.get_queue_url(QueueName=f"{settings.namespace}-failing_jobs-dlq")["QueueUrl"]
    wait_until(lambda: counts(sqs, dlq)[0] == 1)
    run.stop()
    # When an operator lists the DLQ and shows the letter
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    assert cli.main(["dlq", "list", "failing_jobs"]) == 0
    listed = capsys.readouterr().out
    assert cli.main(["dlq", "show", "failing_jobs", job]) == 0
    shown = capsys.readouterr().out
    # Then the consumer's verdict, the error and the whole traceback are there
    assert "failed: attempts used up (1 of 1)" in listed
    assert "ValueError: payment gateway refused" in listed
    assert "Traceback (most recent call last)" in shown and "in charge" in shown
    assert counts(sqs, dlq) == (1, 0)
