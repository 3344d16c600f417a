"""Failures carry their cause, and each job its retry policy, against the moto server over HTTP:
the consumer dead-letters a job on its last attempt with the error type, message and traceback;
`max_attempts` per push; backoff delays that grow; bad `max_attempts` refused before sending."""

from __future__ import annotations

import datetime
import json
import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError

from messenger import Consumer, InvalidMessage, MultiProducer, Producer, PushItem, ReceivedMessage
from messenger.aws import RequestCounter
from messenger.channel import SQS_MAX_MESSAGE_BYTES, ChannelSpec
from messenger.errors import InvalidChannelSpec
from messenger.message import (
    DEAD_LETTER_FAILURE_ATTRIBUTE,
    DEAD_LETTER_REASON_ATTRIBUTE,
    MAX_ATTEMPTS_ATTRIBUTE,
)
from messenger.offload import OffloadPointer
from messenger.provision import Provisioner
from tests.integration import test_consumer_runtime
from tests.integration.helpers import drain, queue_url
from tests.integration.test_consumer_runtime import Recording, dead_letters, wait_until

# The consumer-runtime tests' fixtures: `running(cls, **ConsumerSettings changes)`.
running = test_consumer_runtime.running
runtime = test_consumer_runtime.runtime

#: A value only the body holds: no failure record may repeat it.
SECRET = "card-4111-1111-1111-1111"


class JobsProducer(Producer):
    channel = "failing_jobs"


class Doomed(Recording):
    """Fails every message, a few frames deep, without naming the body in the error."""

    channel = "failing_jobs"

    def handler(self, message: ReceivedMessage) -> None:
        super().handler(message)
        self.charge(message.body, depth=int(message.body.get("depth", 1)))

    def charge(self, body: dict[str, Any], depth: int) -> None:
        if depth > 1:
            try:
                self.charge(body, depth - 1)
            except ValueError as inner:  # each level adds its own chained traceback
                raise ValueError(f"retry {depth} failed") from inner
        raise ValueError(f"payment gateway refused attempt {len(self.handled)}")


def note_of(dead: dict[str, Any]) -> dict[str, Any]:
    attributes = dead["MessageAttributes"]
    return dict(json.loads(attributes[DEAD_LETTER_FAILURE_ATTRIBUTE]["StringValue"]))


def reason_of(dead: dict[str, Any]) -> str:
    return str(dead["MessageAttributes"][DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"])


@pytest.mark.timeout(60)
def test_the_dead_letter_carries_the_error_and_its_traceback_never_the_body(
    settings, clients, running
):
    # Given a job whose handler always fails (channel default: 3 attempts)
    message_id = JobsProducer(settings=settings).push({"card": SECRET})
    run = running(Doomed, retry_delay=0)
    # When it used up its attempts
    [dead] = dead_letters(clients, run.consumer, expected=1)
    run.stop()
    # Then the consumer itself forwarded it, with the reason and what failed
    assert [m.receive_count for m in run.consumer.handled] == [1, 2, 3]
    assert reason_of(dead) == "failed: attempts used up (3 of 3)"
    note = note_of(dead)
    assert note["error_type"] == "ValueError"
    assert note["error_message"] == "payment gateway refused attempt 3"
    assert note["attempts"] == 3
    assert note["consumer"]
    at = datetime.datetime.fromisoformat(note["at"])
    assert at.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.UTC) - at).total_seconds()) < 60
    trace = note["traceback"]
    assert trace.startswith("Traceback (most recent call last):")
    assert "in charge" in trace and 'raise ValueError(f"payment gateway refused' in trace
    assert trace.rstrip().endswith("ValueError: payment gateway refused attempt 3")
    # ... never the body (which travels unchanged)
    assert SECRET not in json.dumps(note) and SECRET in dead["Body"]
    assert dead["MessageAttributes"]["message_id"]["StringValue"] == message_id
    # And every failed event logged the cause; the job was retried twice, never by SQS's redrive
    failed = run.consumer.named("failed")
    assert [e.fields["error_class"] for e in failed] == ["ValueError"] * 3
    assert all("in charge" in e.fields["traceback"] for e in failed)
    assert [e.fields["receive_count"] for e in run.consumer.named("retried")] == [1, 2]
    [lettered] = run.consumer.named("dead_lettered")
    assert lettered.fields["reason"] == "failed: attempts used up (3 of 3)"
    # And the queue is empty: forwarded, then deleted
    assert run.consumer.resources is not None
    assert drain(clients.client("sqs"), run.consumer.resources.queue.url) == []


@pytest.mark.timeout(60)
def test_a_deep_traceback_is_cut_to_its_last_4_kib(settings, clients, running):
    JobsProducer(settings=settings).push({"depth": 100})
    run = running(Doomed, retry_delay=0)
    [dead] = dead_letters(clients, run.consumer, expected=1)
    run.stop()
    trace = note_of(dead)["traceback"]
    assert 4000 < len(trace.encode()) <= 4096 + len("...\n")
    assert trace.startswith("...\n")  # the first errors went, the last one stayed
    assert trace.rstrip().endswith("ValueError: retry 100 failed")


@pytest.mark.timeout(60)
def test_max_attempts_1_dead_letters_after_one_failure_while_the_channel_allows_3(
    settings, clients, running
):
    # Given two jobs on a channel whose max_receives is 3: one pushed with max_attempts=1
    producer = JobsProducer(settings=settings)
    once = producer.push({"job": "once"}, max_attempts=1)
    default = producer.push_many([PushItem({"job": "default"})]).message_ids[0]
    # When a consumer fails on every run
    run = running(Doomed, retry_delay=0)
    dead = dead_letters(clients, run.consumer, expected=2)
    run.stop()
    # Then the first ran once, the other three times, each dead-lettered with its count
    runs = [m.message_id for m in run.consumer.handled]
    assert runs.count(once) == 1 and runs.count(default) == 3
    by_id = {m["MessageAttributes"]["message_id"]["StringValue"]: m for m in dead}
    assert reason_of(by_id[once]) == "failed: attempts used up (1 of 1)"
    assert reason_of(by_id[default]) == "failed: attempts used up (3 of 3)"
    assert note_of(by_id[once])["attempts"] == 1
    # ... and the policy travelled with the message
    assert by_id[once]["MessageAttributes"][MAX_ATTEMPTS_ATTRIBUTE]["StringValue"] == "1"
    assert MAX_ATTEMPTS_ATTRIBUTE not in by_id[default]["MessageAttributes"]


@pytest.mark.timeout(60)
def test_the_consumers_max_attempts_is_the_default_and_a_push_overrides_it(
    settings, clients, running
):
    class Impatient(Doomed):
        max_attempts = 2

    producer = JobsProducer(settings=settings)
    default = producer.push({"job": "default"})
    more = producer.push({"job": "more"}, max_attempts=3)
    run = running(Impatient, retry_delay=0)
    dead = dead_letters(clients, run.consumer, expected=2)
    run.stop()
    by_id = {m["MessageAttributes"]["message_id"]["StringValue"]: m for m in dead}
    assert reason_of(by_id[default]) == "failed: attempts used up (2 of 2)"
    assert reason_of(by_id[more]) == "failed: attempts used up (3 of 3)"


@pytest.mark.timeout(60)
def test_backoff_delays_grow_from_attempt_to_attempt(settings, clients, running):
    # Given a consumer with a 1 s first delay doubling per attempt (3 attempts)
    class Backoff(Doomed):
        retry_delay = 1
        retry_backoff = 2

    delays: list[int] = []

    def capture(params: dict[str, Any], **_: Any) -> None:
        delays.append(int(params["VisibilityTimeout"]))

    clients.register("before-parameter-build.sqs.ChangeMessageVisibility", capture)
    JobsProducer(settings=settings).push({"job": 1})
    # When it fails every time (the runtime's own settings leave the delay to the class)
    run = running(Backoff)
    dead_letters(clients, run.consumer, expected=1)
    run.stop()
    # Then SQS was asked for two delays, drawn in [half, all] of 1 s and 2 s (whole seconds,
    # rounded up: 1, then 2 unless the draw is exactly 0)
    assert delays == [1, 2]
    assert [e.fields["delay"] for e in run.consumer.named("retried")] == delays


def test_max_attempts_0_is_one_clear_error_and_nothing_is_sent(settings, clients):
    producer = JobsProducer(settings=settings, clients=clients)
    producer.push({"warm": True})  # the queue exists; its max_receives is 3
    url = queue_url(clients.client("sqs"), f"{settings.namespace}-failing_jobs")
    drain(clients.client("sqs"), url)
    counter = RequestCounter().attach(clients)
    for bad in (0, 4, True, "2", 1.0):
        with pytest.raises(InvalidMessage) as raised:
            producer.push({"n": 1}, max_attempts=bad)
        assert str(raised.value) == (
            f"max_attempts must be a whole number from 1 to 3 (the max_receives of channel "
            f"'failing_jobs'), got {bad!r}")
    # push_many reports the bad item and sends the good one
    result = producer.push_many([PushItem({"n": 2}, max_attempts=0),
                                 PushItem({"n": 3}, max_attempts=3)])
    assert result.message_ids[0] is None and result.message_ids[1] is not None
    assert [(f.index, f.code) for f in result.failures] == [(0, "InvalidMessage")]
    sends = {k: v for k, v in counter.counts.items() if k.startswith("sqs.Send")}
    assert sends == {"sqs.SendMessageBatch": 1}, counter.counts
    # The channel's max_receives was read once, for the first push that gave max_attempts
    assert counter.counts["sqs.GetQueueAttributes"] == 1
    assert [json.loads(m["Body"]) for m in drain(clients.client("sqs"), url)] == [{"n": 3}]


def test_a_consumer_whose_max_attempts_exceeds_max_receives_is_refused(settings, clients):
    class TooMany(Doomed):
        max_attempts = 4

    with pytest.raises(InvalidChannelSpec, match=r"TooMany.max_attempts must be a whole number "
                       r"from 1 to 3 \(TooMany.max_receives\), got 4"):
        TooMany(settings=settings, clients=clients)


class EventsProducer(MultiProducer):
    channel = "failing_events"
    priorities = ("high", "low")


class EventsConsumer(Consumer):
    channel = "failing_events.audit"
    priorities = ("high", "low")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs = 0
        self.ran = threading.Event()

    def handler(self, message: ReceivedMessage) -> None:
        self.runs += 1
        self.ran.set()
        raise RuntimeError("audit store down")


@pytest.mark.timeout(60)
def test_the_fullest_dead_letter_stays_within_sqs_10_attributes(settings, clients, running):
    # Given a job with every attribute a message can carry: routing key, meta headers, priority
    # (an exchange routes levels by attribute), an offloaded body and max_attempts
    spec = ChannelSpec("failing_events.audit", priorities=("high", "low"),
                       namespace=settings.namespace)
    levels = Provisioner(clients, settings).ensure_channel(spec).levels
    producer = EventsProducer(settings=settings.with_changes(offload_threshold=1024))
    producer.push({"pad": "x" * 4096}, routing_key="AUDIT.1", meta_headers={"locale": "de"},
                  priority="high", max_attempts=1)
    # When its consumer fails on it
    run = running(EventsConsumer, retry_delay=0)
    high = next(level for level in levels if level.spec.priority_level == "high")
    sqs = clients.client("sqs")
    found: list[dict[str, Any]] = []

    def collect() -> bool:
        found.extend(sqs.receive_message(
            QueueUrl=high.dlq.url, WaitTimeSeconds=1, MessageAttributeNames=["All"],
        ).get("Messages", []))
        return bool(found)

    wait_until(collect, timeout=30)
    run.stop()
    # Then its level's DLQ took it with both dead-letter attributes: 9 of SQS's 10
    [dead] = found
    names = set(dead["MessageAttributes"])
    assert names == {"message_id", "produced_at", "meta_headers", "routing_key", "priority",
                     "ExtendedPayloadSize", MAX_ATTEMPTS_ATTRIBUTE,
                     DEAD_LETTER_REASON_ATTRIBUTE, DEAD_LETTER_FAILURE_ATTRIBUTE}
    assert len(names) <= 10
    assert run.consumer.runs == 1
    # ... and the body is still the pointer to the offloaded payload
    assert OffloadPointer.parse(dead["Body"], dead["MessageAttributes"]) is not None
    assert note_of(dead)["error_message"] == "audit store down"


def sqs_size_rule(params: dict[str, Any], **_: Any) -> None:
    """AWS's rule, which moto does not apply: body plus attribute names, types and values of a
    SendMessage at most 1 MiB (moto counts the body only)."""
    size = len(params["MessageBody"].encode())
    for name, value in params.get("MessageAttributes", {}).items():
        size += len(name.encode()) + len(value["DataType"].encode())
        size += len(value.get("StringValue", "").encode())
    if size > SQS_MAX_MESSAGE_BYTES:
        raise ClientError({"Error": {"Code": "InvalidParameterValue", "Message": (
            f"One or more parameters are invalid. Reason: Message must be shorter than "
            f"{SQS_MAX_MESSAGE_BYTES} bytes.")}}, "SendMessage")


@pytest.mark.timeout(60)
def test_a_job_at_sqs_size_limit_is_dead_lettered_without_its_traceback(
    settings, clients, running
):
    # Given a job whose body leaves no room for a traceback in its DLQ copy (AWS's size rule)
    clients.register("before-parameter-build.sqs.SendMessage", sqs_size_rule)
    producer = JobsProducer(settings=settings.with_changes(offload_threshold=SQS_MAX_MESSAGE_BYTES))
    producer.push({"pad": "x" * (SQS_MAX_MESSAGE_BYTES - 700)}, max_attempts=1)
    # When its handler fails
    run = running(Doomed, retry_delay=0)
    [dead] = dead_letters(clients, run.consumer, expected=1)
    run.stop()
    # Then the message is in the DLQ, whole, with the error but not the traceback
    assert len(dead["Body"]) == SQS_MAX_MESSAGE_BYTES - 700 + len('{"pad":""}')
    note = note_of(dead)
    assert note["error_type"] == "ValueError" and note["attempts"] == 1
    assert note["traceback"] == "(left out: SQS's size limit)"
    assert not run.consumer.named("dead_letter_failed")
