"""messenger's SQS index over moto (messenger.tools.moto_sqs): clients get stock moto's answers.

Each parity test runs the same calls against the session's endpoint (indexed) and a stock moto
server (`messenger local --stock-moto`) and compares what an SQS client sees: bodies and their
order, MD5s, message and system attributes, approximate counts, error codes. Message ids and
receipt handles are random on both, so transcripts name messages by body. The FIFO tests at the
end cover where the index departs from stock moto toward SQS.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from messenger.tools import moto_sqs
from messenger.tools.local import LOCAL_CREDENTIALS, LocalProcess, start_local_process

COUNTS = [
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
]
#: System attributes that are the same on every run (timestamps and sender are not compared).
STABLE_ATTRIBUTES = ("ApproximateReceiveCount", "MessageGroupId", "MessageDeduplicationId")

Transcript = list[Any]


@pytest.fixture(scope="module")
def stock_endpoint() -> Iterator[LocalProcess]:
    server = start_local_process(stock_moto=True)
    yield server
    server.stop()


def client(kind: str, url: str) -> Any:
    return boto3.client(
        kind,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def same_on_both(
    endpoint: str, stock: LocalProcess, scenario: Callable[[Any, Any, Transcript], None]
) -> Transcript:
    """Run `scenario(sqs, sns, transcript)` on both servers (one thread each); assert that the
    transcripts match and return the indexed one."""
    results: dict[str, Transcript] = {}
    errors: list[BaseException] = []

    def run(name: str, sqs: Any, sns: Any) -> None:
        transcript: Transcript = []
        try:
            scenario(sqs, sns, transcript)
        except BaseException as exc:  # reported below, with the server it happened on
            errors.append(exc)
        results[name] = transcript

    threads = [  # clients made here: making them is not thread-safe
        threading.Thread(target=run, args=(name, client("sqs", url), client("sns", url)))
        for name, url in (("indexed", endpoint), ("stock", stock.url))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    assert results["indexed"] == results["stock"]
    return results["indexed"]


def seen(response: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What a receive returned, without what differs from run to run."""
    return [
        (
            m["Body"],
            m["MD5OfBody"],
            m.get("MD5OfMessageAttributes"),
            sorted(m.get("MessageAttributes", {})),
            {k: v for k, v in m.get("Attributes", {}).items() if k in STABLE_ATTRIBUTES},
        )
        for m in response.get("Messages", [])
    ]


def counts(sqs: Any, url: str) -> dict[str, str]:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=COUNTS)["Attributes"]


def error_code(call: Callable[[], Any]) -> str:
    try:
        call()
    except ClientError as exc:
        return str(exc.response["Error"]["Code"])
    return "ok"


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def test_standard_queue_send_receive_delete_visibility_and_counts(endpoint, stock_endpoint):
    def scenario(sqs: Any, sns: Any, out: Transcript) -> None:
        url = sqs.create_queue(QueueName=unique("parity"))["QueueUrl"]
        attributes = {
            "Custom.kind": {"DataType": "String", "StringValue": "a"},
            "Other": {"DataType": "Number", "StringValue": "7"},
        }
        entries = [
            {"Id": f"e{i}", "MessageBody": f"body-{i}", "MessageAttributes": attributes}
            for i in range(10)
        ]
        entries[9]["DelaySeconds"] = 60
        sent = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        out.append(sorted((s["Id"], s["MD5OfMessageBody"]) for s in sent["Successful"]))
        out.append(counts(sqs, url))  # 9 ready, 1 delayed
        first = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=4,
            VisibilityTimeout=60,
            MessageAttributeNames=["Custom.*"],
            AttributeNames=["All"],
        )
        out.append(seen(first))
        out.append(counts(sqs, url))  # 5 ready, 4 leased, 1 delayed
        handles = [m["ReceiptHandle"] for m in first["Messages"]]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=handles[0])
        sqs.delete_message(QueueUrl=url, ReceiptHandle=handles[0])  # twice: accepted
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handles[1], VisibilityTimeout=0)
        out.append(counts(sqs, url))
        out.append(
            error_code(lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle"))
        )
        out.append(
            error_code(
                lambda: sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=handles[0], VisibilityTimeout=5
                )
            )
        )  # a deleted message
        out.append(
            error_code(
                lambda: sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=handles[2], VisibilityTimeout=43201
                )
            )
        )
        batch = sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": "good", "ReceiptHandle": handles[2]},
                {"Id": "bad", "ReceiptHandle": "nope"},
            ],
        )
        out.append(([s["Id"] for s in batch["Successful"]], [f["Id"] for f in batch["Failed"]]))
        rest = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60, AttributeNames=["All"]
        )
        out.append(seen(rest))  # the made-visible one comes back in arrival order
        out.append(counts(sqs, url))
        sqs.purge_queue(QueueUrl=url)
        out.append(counts(sqs, url))

    transcript = same_on_both(endpoint, stock_endpoint, scenario)
    # Then (beyond "same as stock"): what SQS answers
    assert transcript[1] == dict(zip(COUNTS, ["9", "0", "1"], strict=True))
    assert [m[0] for m in transcript[2]] == ["body-0", "body-1", "body-2", "body-3"]
    assert transcript[2][0][3] == ["Custom.kind"]
    assert transcript[3] == dict(zip(COUNTS, ["5", "4", "1"], strict=True))
    assert transcript[5:8] == [
        "ReceiptHandleIsInvalid",
        "ReceiptHandleIsInvalid",
        "InvalidParameterValue",
    ]
    assert [m[0] for m in transcript[9]] == ["body-1"] + [f"body-{i}" for i in range(4, 9)]
    assert transcript[11] == dict(zip(COUNTS, ["0", "0", "0"], strict=True))


def test_fifo_deduplication_and_group_order(endpoint, stock_endpoint):
    def scenario(sqs: Any, sns: Any, out: Transcript) -> None:
        url = sqs.create_queue(
            QueueName=unique("parity") + ".fifo",
            Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
        )["QueueUrl"]
        for i in range(6):
            sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="ab"[i % 2])
        sqs.send_message(QueueUrl=url, MessageBody="m0", MessageGroupId="a")  # content dup
        sqs.send_message(
            QueueUrl=url, MessageBody="x", MessageGroupId="c", MessageDeduplicationId="d1"
        )
        sqs.send_message(
            QueueUrl=url, MessageBody="y", MessageGroupId="c", MessageDeduplicationId="d1"
        )  # explicit dup
        batch = sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": f"e{i}", "MessageBody": f"n{i}", "MessageGroupId": "d"} for i in range(3)
            ]
            + [{"Id": "dup", "MessageBody": "n0", "MessageGroupId": "d"}],
        )
        out.append(sorted(s["Id"] for s in batch["Successful"]))
        out.append(counts(sqs, url))
        first = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=3, VisibilityTimeout=60, AttributeNames=["All"]
        )
        out.append(seen(first))
        out.append(
            seen(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60))
        )
        out.append(seen(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)))  # all locked
        for message in first["Messages"]:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        out.append(
            seen(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60))
        )
        out.append(counts(sqs, url))
        out.append(error_code(lambda: sqs.send_message(QueueUrl=url, MessageBody="no group")))

    transcript = same_on_both(endpoint, stock_endpoint, scenario)
    assert transcript[1]["ApproximateNumberOfMessages"] == "10"  # 6 + x + n0..n2
    assert [m[0] for m in transcript[2]] == ["m0", "m1", "m2"]
    assert [m[0] for m in transcript[3]] == ["x", "n0", "n1", "n2"]
    assert transcript[4] == []
    assert [m[0] for m in transcript[5]] == ["m3", "m4", "m5"]
    assert transcript[7] == "MissingParameter"


def test_redrive_to_dead_letter_queue(endpoint, stock_endpoint):
    def scenario(sqs: Any, sns: Any, out: Transcript) -> None:
        dlq = sqs.create_queue(QueueName=unique("dlq"))["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        url = sqs.create_queue(
            QueueName=unique("src"),
            Attributes={
                "RedrivePolicy": f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"2"}}'
            },
        )["QueueUrl"]
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": f"e{i}", "MessageBody": f"b{i}"} for i in range(3)]
        )
        for _ in range(3):  # visibility 0: every receive sees them again at once
            out.append(
                seen(
                    sqs.receive_message(
                        QueueUrl=url,
                        MaxNumberOfMessages=10,
                        VisibilityTimeout=0,
                        AttributeNames=["ApproximateReceiveCount"],
                    )
                )
            )
            out.append((counts(sqs, url), counts(sqs, dlq)))
        out.append(
            seen(
                sqs.receive_message(
                    QueueUrl=dlq, MaxNumberOfMessages=10, AttributeNames=["ApproximateReceiveCount"]
                )
            )
        )

    transcript = same_on_both(endpoint, stock_endpoint, scenario)
    assert [m[4]["ApproximateReceiveCount"] for m in transcript[2]] == ["2", "2", "2"]
    assert transcript[4] == []  # third receive: all moved
    assert transcript[5][1]["ApproximateNumberOfMessages"] == "3"
    assert [m[0] for m in transcript[6]] == ["b0", "b1", "b2"]


def test_lapsed_leases_and_long_poll(endpoint, stock_endpoint):
    def scenario(sqs: Any, sns: Any, out: Transcript) -> None:
        url = sqs.create_queue(QueueName=unique("lease"))["QueueUrl"]
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": f"e{i}", "MessageBody": f"b{i}"} for i in range(3)]
        )
        leased = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=1)
        out.append(seen(leased))
        out.append(counts(sqs, url))
        time.sleep(1.3)  # the leases lapse
        out.append(counts(sqs, url))
        again = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=60,
            AttributeNames=["ApproximateReceiveCount"],
        )
        out.append(seen(again))
        # an old receipt handle still deletes (stock moto keeps every handle a message had)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=leased["Messages"][0]["ReceiptHandle"])
        out.append(counts(sqs, url))
        empty = sqs.create_queue(QueueName=unique("poll"))["QueueUrl"]
        out.append(seen(sqs.receive_message(QueueUrl=empty, WaitTimeSeconds=1)))
        sender = threading.Timer(0.5, lambda: sqs.send_message(QueueUrl=url, MessageBody="late"))
        sender.start()
        out.append(seen(sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)))  # woken by "late"
        sender.join()

    transcript = same_on_both(endpoint, stock_endpoint, scenario)
    assert transcript[1]["ApproximateNumberOfMessagesNotVisible"] == "2"
    assert transcript[2]["ApproximateNumberOfMessagesNotVisible"] == "0"
    assert [(m[0], m[4]["ApproximateReceiveCount"]) for m in transcript[3]] == [
        ("b0", "2"),
        ("b1", "2"),
        ("b2", "1"),
    ]
    assert transcript[4]["ApproximateNumberOfMessagesNotVisible"] == "2"
    assert transcript[5] == []
    assert [m[0] for m in transcript[6]] == ["late"]


def test_sns_fan_out_into_queues(endpoint, stock_endpoint):
    def scenario(sqs: Any, sns: Any, out: Transcript) -> None:
        topic = sns.create_topic(Name=unique("topic"))["TopicArn"]
        url = sqs.create_queue(QueueName=unique("sub"))["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        sns.subscribe(
            TopicArn=topic,
            Protocol="sqs",
            Endpoint=arn,
            Attributes={"RawMessageDelivery": "true"},
        )
        sns.publish_batch(
            TopicArn=topic,
            PublishBatchRequestEntries=[{"Id": f"p{i}", "Message": f"event-{i}"} for i in range(5)],
        )
        out.append(counts(sqs, url))
        out.append(seen(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)))

    transcript = same_on_both(endpoint, stock_endpoint, scenario)
    assert [m[0] for m in transcript[1]] == [f"event-{i}" for i in range(5)]


# -- where the index departs from stock moto, toward SQS -------------------------------------


def fifo_queue(sqs: Any) -> str:
    return sqs.create_queue(
        QueueName=unique("order") + ".fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]


def test_fifo_group_comes_back_in_order_when_its_leases_lapse_together(endpoint):
    # Given three messages of one group received together and never deleted
    sqs = client("sqs", endpoint)
    url = fifo_queue(sqs)
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"step-{i}", MessageGroupId="g")
    leased = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1)
    assert [m["Body"] for m in leased["Messages"]] == ["step-0", "step-1", "step-2"]
    time.sleep(1.3)
    # When their leases have lapsed, the group is received again
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=60)
    # Then it starts where it started before (stock moto returned step-2 first)
    assert [m["Body"] for m in again["Messages"]] == ["step-0"]


def test_long_poll_wakes_when_its_fifo_group_unlocks(endpoint):
    # Given a group whose first message is leased and a long poll waiting for the group
    sqs = client("sqs", endpoint)
    url = fifo_queue(sqs)
    for i in range(2):
        sqs.send_message(QueueUrl=url, MessageBody=f"step-{i}", MessageGroupId="g")
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=60)
    handle = first["Messages"][0]["ReceiptHandle"]
    delete = threading.Timer(0.5, lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle=handle))
    delete.start()
    # When the lease holder deletes its message while the poll waits
    polled = client("sqs", endpoint).receive_message(
        QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=20
    )
    delete.join()
    # Then that poll returns the group's next step (stock moto slept the full 20 s, empty)
    assert [m["Body"] for m in polled.get("Messages", [])] == ["step-1"]


def test_long_poll_wakes_when_a_lease_lapses(endpoint):
    # Given a FIFO group locked by a 1-second lease, and a long poll
    sqs = client("sqs", endpoint)
    url = fifo_queue(sqs)
    sqs.send_message(QueueUrl=url, MessageBody="only", MessageGroupId="g")
    sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)
    # When the lease lapses during the poll, Then the poll gets the message again
    polled = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20, AttributeNames=["All"])
    assert [
        (m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in polled["Messages"]
    ] == [("only", "2")]


def test_twelve_hours_in_flight_count_from_the_receive_not_the_send(endpoint):
    # Given a message that waited 2 s in its queue before its receive (SQS: "a total
    # visibility timeout of 12 hours" since the receive; stock moto counted from the send)
    sqs = client("sqs", endpoint)
    url = sqs.create_queue(QueueName=f"twelve-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="waited")
    time.sleep(2)
    [message] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    # When its lease is extended to 1 s short of 12 hours from its receive, Then SQS takes it
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"],
                                  VisibilityTimeout=43_199)
    # And past 12 hours from the receive it is refused
    with pytest.raises(ClientError) as refused:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"],
                                      VisibilityTimeout=43_200)
    assert "beyond the limit [43200 seconds]" in str(refused.value)


def test_other_moto_versions_are_left_alone(monkeypatch, caplog):
    # Given a moto release the index was not written for
    import moto
    from moto.sqs import models

    monkeypatch.setattr(moto, "__version__", "5.3.0")
    monkeypatch.setattr(moto_sqs, "_applied", False)
    stock_receive = models.SQSBackend.receive_message
    # When the endpoint tries to apply it
    with caplog.at_level(logging.WARNING, logger=moto_sqs.__name__):
        applied = moto_sqs.apply()
    # Then nothing is patched, and the log says why
    assert applied is False
    assert models.SQSBackend.receive_message is stock_receive
    assert "moto 5.3.0 is installed" in caplog.text and moto_sqs.MOTO_VERSION in caplog.text
