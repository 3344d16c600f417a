"""messenger.spark's partition publisher on its own (no SparkSession), against the moto server:
several batches in flight per partition, one lane per message group.

`PartitionPublisher` is what each Spark task runs; calling it directly on Rows lets a test hold
every batch for a moment and see which ones overlap. Counters stand in for Spark's accumulators.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import parse_qsl

import pytest

from messenger import ChannelSpec, MultiProducer, Settings
from messenger.provision import Provisioner
from messenger.spark import COUNTERS, ExecutorSettings, PartitionPublisher, RowMapping
from tests.faults import _RawBody, injected, throttling_response
from tests.integration.helpers import decode, drain

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import Row  # noqa: E402

GROUPS = 20
ROWS_PER_GROUP = 15


class LaneProducer(MultiProducer):
    channel = "lanes"
    ordered = True


class Total:
    """What a publishing task adds to (a Spark accumulator on a cluster)."""

    def __init__(self) -> None:
        self.value = 0

    def add(self, value: int) -> None:
        self.value += value


class BatchWatch:
    """botocore `before-send` hook on PublishBatch: holds each request `hold` seconds and notes
    which requests overlapped, and whether two requests of one message group ever did."""

    def __init__(self, hold: float = 0.03) -> None:
        self.hold = hold
        self.lock = threading.Lock()
        self.groups_in_flight: set[str] = set()
        self.requests_in_flight = 0
        self.most_in_flight = 0
        self.group_overlaps: list[str] = []

    def __call__(self, request: Any, **_: Any) -> None:
        groups = {
            value for key, value in parse_qsl(text(request.body))
            if key.endswith(".MessageGroupId")
        }
        with self.lock:
            self.group_overlaps.extend(sorted(groups & self.groups_in_flight))
            self.groups_in_flight |= groups
            self.requests_in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.requests_in_flight)
        time.sleep(self.hold)
        with self.lock:
            self.groups_in_flight -= groups
            self.requests_in_flight -= 1


class ThrottleFirstTries:
    """botocore `before-send` hook: throttles the first attempt of every `every`-th request
    (its retries, the same body, pass): a lane's retry is exercised on every run, and no batch
    can spend the retry budget on throttles drawn at random."""

    def __init__(self, every: int = 3) -> None:
        self.every = every
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.injected = 0

    def __call__(self, request: Any, **_: Any) -> Any:
        body = text(request.body)
        with self.lock:
            if body in self.seen:
                return None
            self.seen.add(body)
            if len(self.seen) % self.every:
                return None
            self.injected += 1
        return throttling_response("query", request.url)


def text(body: str | bytes) -> str:
    """A request's url-encoded body as text (botocore prepares it as str)."""
    return body.decode() if isinstance(body, bytes) else body


def rows_by_seq() -> list[Any]:
    """GROUPS users with ROWS_PER_GROUP rows each, in publish's order (sorted by seq)."""
    row = Row("user_id", "seq")
    return [row(f"u{user}", seq) for seq in range(ROWS_PER_GROUP) for user in range(GROUPS)]


def publisher(executor: ExecutorSettings, lanes: int = 4) -> tuple[PartitionPublisher, dict]:
    counters = {name: Total() for name in COUNTERS}
    mapping = RowMapping(body=["user_id", "seq"], group_id="user_id",
                         dedup_key=["user_id", "seq"])
    return PartitionPublisher(LaneProducer, executor, mapping, counters, lanes), counters


def received_in_order(clients: Any, queue_url: str) -> dict[str, list[int]]:
    """The exchange's queue drained: each user's seqs in the order the queue gave them."""
    by_user: dict[str, list[int]] = {}
    for message in drain(clients.client("sqs"), queue_url):
        body = decode(message).body
        by_user.setdefault(body["user_id"], []).append(body["seq"])
    return by_user


@pytest.fixture
def queue_url(settings: Settings, clients: Any) -> str:
    """The URL of the exchange's one queue (an ordered queue of its own: the group order)."""
    resources = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("lanes.all", ordered=True, namespace=settings.namespace)
    )
    return resources.queue.url


@pytest.fixture
def executor(settings: Settings, endpoint: str) -> ExecutorSettings:
    return ExecutorSettings(settings, endpoint_url=endpoint)


def test_batches_of_other_groups_overlap_and_each_group_keeps_its_order(executor, queue_url,
                                                                          clients):
    # Given a partition's rows of 20 users, 4 lanes, every PublishBatch held 30 ms, and a third
    # of them throttled once (retried by the lane before the group's next batch may go)
    task, counters = publisher(executor, lanes=4)
    watch, throttle = BatchWatch(), ThrottleFirstTries(every=3)
    factory = executor.client_factory()
    # When the partition is published
    with injected(factory, "before-send.sns.PublishBatch", watch), \
            injected(factory, "before-send.sns.PublishBatch", throttle):
        failed = list(task(0, rows_by_seq()))
    # Then batches were in flight together, never two of one group, and every user's rows
    # arrived once each, in order
    assert failed == []
    assert counters["published"].value == GROUPS * ROWS_PER_GROUP
    assert throttle.injected > 0
    assert watch.most_in_flight > 1
    assert watch.group_overlaps == []
    by_user = received_in_order(clients, queue_url)
    assert by_user == {f"u{user}": list(range(ROWS_PER_GROUP)) for user in range(GROUPS)}


def test_a_refused_batch_goes_to_the_side_output_while_other_lanes_publish(executor, queue_url,
                                                                            clients):
    # Given every PublishBatch that carries user u3 refused (not transient: no retry)
    task, counters = publisher(executor, lanes=4)

    def refuse_u3(request: Any, **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        if "MessageGroupId=u3&" not in text(request.body) + "&":
            return None
        body = (b"<ErrorResponse><Error><Type>Sender</Type><Code>AuthorizationError</Code>"
                b"<Message>not allowed</Message></Error><RequestId>x</RequestId></ErrorResponse>")
        return AWSResponse(request.url, 403, {"Content-Type": "text/xml"}, _RawBody(body))

    # When the partition is published
    with injected(executor.client_factory(), "before-send.sns.PublishBatch", refuse_u3):
        failed = list(task(0, rows_by_seq()))
    # Then u3's rows (and those batched with them) come back as failed rows with the code, the
    # others are published in order, and nothing is lost
    failed_rows = {(user, seq) for user, seq, _, _ in failed}
    assert {("u3", seq) for seq in range(ROWS_PER_GROUP)} <= failed_rows
    assert {code for _, _, code, _ in failed} == {"AuthorizationError"}
    published = counters["published"].value
    assert published > 0 and published + len(failed) == GROUPS * ROWS_PER_GROUP
    assert counters["failed"].value == len(failed)
    by_user = received_in_order(clients, queue_url)
    assert sum(len(seqs) for seqs in by_user.values()) == published
    assert "u3" not in by_user
    for user, seqs in by_user.items():
        expected = [seq for seq in range(ROWS_PER_GROUP) if (user, seq) not in failed_rows]
        assert seqs == expected, user

