"""messenger.spark and the price-drop job in real Spark local mode, publishing to the moto server.

One SparkSession for the test process (`spark`, session-scoped: its JVM takes 15-20 s to start on
2 busy cores, so a pytest-xdist worker starts it once, whichever of this module's tests it runs,
and keeps it while it runs other files' tests between them). Its JVM (and so every Python worker)
starts with a dead AWS_ENDPOINT_URL and no MESSENGER_NAMESPACE: every test that publishes proves
that the endpoint and settings reach the executors explicitly, from the driver. This module is
pickled by value (cloudpickle), so the executors get its producer classes without importing it.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from messenger import ChannelSpec, MessageFilter, MultiProducer, Producer, Settings
from messenger.aws import ClientFactory
from messenger.provision import ChannelResources, Provisioner
from messenger.spark import (
    DEFAULT_LANES,
    MAX_CONSECUTIVE_BATCH_ERRORS,
    NOT_ATTEMPTED,
    RUN_CHUNK_ROWS,
    ExecutorSettings,
    PublishReport,
    RowMapping,
    publish,
)
from messenger.tools.local import LocalProcess

pyspark = pytest.importorskip("pyspark")
from pyspark import cloudpickle  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from spark_jobs import generate_sample_data, wishlist_price_drops  # noqa: E402

DEAD_ENDPOINT = "http://127.0.0.1:9"
EXCHANGE = "wishlist_events"


class DropProducer(MultiProducer):
    channel = EXCHANGE
    ordered = True


class AuditProducer(MultiProducer):
    channel = "audit"


@pytest.fixture(scope="session")
def spark(local_endpoint: LocalProcess) -> Iterator[SparkSession]:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test classes, on executors
    saved = {name: os.environ.get(name) for name in ("AWS_ENDPOINT_URL", "MESSENGER_NAMESPACE")}
    os.environ["AWS_ENDPOINT_URL"] = DEAD_ENDPOINT
    os.environ.pop("MESSENGER_NAMESPACE", None)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        session = (
            SparkSession.builder.master("local[2]")
            .appName("messenger-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.default.parallelism", "2")
            .config("spark.executorEnv.PYTHONPATH", str(ROOT))  # spark_jobs, as --py-files would
            # A short-lived JVM on 2 shared cores: C1 only and one GC thread leave the CPU to the
            # work (this module took 48-50 s instead of 65-67 s, start 5 s instead of 8-11 s).
            .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
            .getOrCreate()
        )
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def executor(settings: Settings, endpoint: str) -> ExecutorSettings:
    return ExecutorSettings(settings, endpoint_url=endpoint)


def exchange_queues(clients: ClientFactory, settings: Settings) -> dict[str, ChannelResources]:
    """The demo's wishlist exchange: all events, mobile (prefix) and apple (exact) queues."""
    provisioner = Provisioner(clients, settings)
    filters = {
        "all_events": None,
        "mobile_events": MessageFilter("prefix", ["MOBILE."]),
        "apple_events": MessageFilter("exact", ["MOBILE.APPLE"]),
    }
    return {
        name: provisioner.ensure_channel(
            ChannelSpec(name=f"{EXCHANGE}.{name}", ordered=True, message_filter=message_filter,
                        namespace=settings.namespace)
        )
        for name, message_filter in filters.items()
    }


def depth(clients: ClientFactory, queue: ChannelResources) -> int:
    attributes = clients.client("sqs").get_queue_attributes(
        QueueUrl=queue.queue.url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


class Drainer(threading.Thread):
    """Receives and deletes a queue's messages while Spark publishes (moto slows down as a
    queue grows), keeping bodies and routing keys in the order received."""

    def __init__(self, clients: ClientFactory, queue: ChannelResources) -> None:
        super().__init__(daemon=True)
        self.sqs = clients.client("sqs")
        self.url = queue.queue.url
        self.received: list[tuple[dict[str, Any], str]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        idle_since = None
        while True:
            messages = self.sqs.receive_message(
                QueueUrl=self.url, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                WaitTimeSeconds=0,
            ).get("Messages", [])
            for message in messages:
                key = message["MessageAttributes"]["routing_key"]["StringValue"]
                self.received.append((json.loads(message["Body"]), key))
            if messages:
                idle_since = None
                self.sqs.delete_message_batch(QueueUrl=self.url, Entries=[
                    {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                    for n, m in enumerate(messages)
                ])
            elif self.stopping.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 1.0:
                    return
            else:
                time.sleep(0.05)


def routing_key_of(n: int) -> str:
    if n % 25 == 0:
        return "MOBILE.APPLE"
    return ["MOBILE.SAMSUNG", "TV.SONY", "LAPTOP.LENOVO", "AUDIO.BOSE"][n % 4]


def test_publishes_10000_rows_with_routing_and_group_order(
    spark: SparkSession, settings: Settings, clients: ClientFactory, executor: ExecutorSettings,
    tmp_path: Path,
) -> None:
    # Given the ordered wishlist exchange with its Apple queue (exact 'MOBILE.APPLE': 1 row in
    # 25), drained while Spark publishes. Only this queue is subscribed: moto's SQS costs grow
    # with queue depth per message, so 10,000 messages fanned out to queues would take minutes.
    provisioner = Provisioner(clients, settings)
    apple = provisioner.ensure_channel(ChannelSpec(
        name=f"{EXCHANGE}.apple_events", ordered=True, namespace=settings.namespace,
        message_filter=MessageFilter("exact", ["MOBILE.APPLE"]),
    ))
    drainer = Drainer(clients, apple)
    drainer.start()
    rows = [(f"u{n % 40}", n // 40, routing_key_of(n)) for n in range(10_000)]
    df = spark.createDataFrame(rows, "user_id string, seq int, routing_key string").repartition(3)

    # When the DataFrame is published, grouped by user and ordered by seq
    report = publish(
        df, DropProducer, body=["user_id", "seq"], routing_key="routing_key",
        group_id="user_id", dedup_key=["user_id", "seq"], order_by=["seq"],
        failed_path=str(tmp_path / "failed"), executor=executor,
    )
    drainer.stopping.set()
    drainer.join(timeout=60)

    # Then SNS took every row in batches of 10, nothing failed, and the Apple queue got
    # exactly its 400 rows, each user's in order
    assert (report.published, report.failed, report.offloaded) == (10_000, 0, 0)
    assert report.requests <= 10_000 / 10 + 4 * 3  # + topic lookup per partition
    assert report.requests_per_message <= 0.11
    expected = sorted(row for row in rows if row[2] == "MOBILE.APPLE")
    received = [(body["user_id"], body["seq"], key) for body, key in drainer.received]
    assert len(received) == len(expected) == 400
    assert sorted(received) == expected
    seen: dict[str, int] = {}
    for user, seq, _ in received:
        assert seq > seen.get(user, -1), f"{user}: {seq} after {seen[user]}"
        seen[user] = seq
    assert not any(path.stat().st_size for path in (tmp_path / "failed").glob("part-*"))


def test_rows_that_fail_go_to_the_side_output(
    spark: SparkSession, settings: Settings, clients: ClientFactory, executor: ExecutorSettings,
    tmp_path: Path,
) -> None:
    # Given a standard exchange and rows of which every 25th has no valid routing key
    queue = Provisioner(clients, settings).ensure_channel(
        ChannelSpec(name="audit.log", namespace=settings.namespace)
    )
    rows = [(n, "" if n % 25 == 0 else "AUDIT.ROW") for n in range(100)]
    df = spark.createDataFrame(rows, "n int, routing_key string")

    report = publish(
        df, AuditProducer, routing_key="routing_key", failed_path=str(tmp_path / "failed"),
        executor=executor,
    )

    # Then the 4 bad rows are in the side output with the reason; the rest were published
    assert (report.published, report.failed, report.exit_code) == (96, 4, 1)
    failed = spark.read.json(str(tmp_path / "failed")).collect()
    assert sorted(row["n"] for row in failed) == [0, 25, 50, 75]
    assert {row["_failure_code"] for row in failed} == {"InvalidMessage"}
    assert all("routing_key" in row["_failure_reason"] for row in failed)
    assert depth(clients, queue) == 96


def test_channel_unreachable_keeps_every_row(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    # Given an endpoint nobody listens on and a short retry budget
    executor = ExecutorSettings(settings.with_changes(retry_budget_seconds=0.3), DEAD_ENDPOINT)
    df = spark.createDataFrame([(n,) for n in range(300)], "n int")

    report = publish(df, AuditProducer, failed_path=str(tmp_path / "failed"), executor=executor,
                     partitions=1)

    # Then every row is kept: those tried until 3 batches in a row had failed (plus those
    # already in flight), the rest not even attempted
    assert (report.published, report.failed) == (0, 300)
    failed = spark.read.json(str(tmp_path / "failed")).collect()
    assert sorted(row["n"] for row in failed) == list(range(300))
    codes = [row["_failure_code"] for row in failed]
    tried = codes.count("PublishFailed")
    assert 30 <= tried <= (MAX_CONSECUTIVE_BATCH_ERRORS + 2 * DEFAULT_LANES) * 10
    assert codes.count(NOT_ATTEMPTED) == 300 - tried


def test_bad_arguments_fail_on_the_driver(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.createDataFrame([(1, "a")], "n int, key string")
    with pytest.raises(ValueError, match="routing_key=.*'missing'.*n, key"):
        publish(df, AuditProducer, routing_key="missing", failed_path=str(tmp_path / "f"))
    with pytest.raises(ValueError, match=r"dedup_key=\) applies to ordered.*'audit'"):
        publish(df, AuditProducer, dedup_key=["key"], failed_path=str(tmp_path / "f"))
    # group_id on a standard channel is the fair-queue tenant key: accepted
    RowMapping(group_id="key").check(df.columns, AuditProducer)


# -- the price-drop job -------------------------------------------------------------------------
PRICES = [  # item, category, brand, yesterday, today
    ("I1", "mobile", "Apple", 1000.0, 900.0),      # -10 %: a drop
    ("I2", "tv", "Sony", 500.0, 490.0),            # -2 %: below --min-drop-pct 5
    ("I3", "audio", "Bose", 300.0, 330.0),         # a rise
    ("I4", "laptop", "Lenovo", 800.0, 600.0),      # -25 %
    ("I5", "x" * 300, "Acme", 100.0, 50.0),        # a drop whose routing key is too long
]
WISHLIST = [("u1", "I1"), ("u1", "I2"), ("u1", "I4"), ("u2", "I1"), ("u2", "I3"), ("u3", "I5")]


def write_input(base: Path, prices: list[tuple[Any, ...]]) -> Path:
    (base / "wishlist").mkdir(parents=True)
    (base / "prices").mkdir()
    with open(base / "wishlist" / "part-0.csv", "w", newline="") as out:
        csv.writer(out).writerows([("user_id", "item_id"), *WISHLIST])
    with open(base / "prices" / "part-0.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(("item_id", "category", "brand", "price", "price_date"))
        for item, category, brand, yesterday, today in prices:
            writer.writerow((item, category, brand, yesterday, "2026-11-20"))
            writer.writerow((item, category, brand, today, "2026-11-21"))
    return base


def run_job(spark: SparkSession, data: Path, failed: Path, settings: Settings, url: str,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = wishlist_price_drops.main(
        ["--input", str(data), "--format", "csv", "--failed-output", str(failed),
         "--namespace", settings.namespace, "--endpoint-url", url],
        spark=spark,
    )
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_price_drop_job_publishes_each_drop_once_even_when_rerun(
    spark: SparkSession, settings: Settings, clients: ClientFactory, endpoint: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    queues = exchange_queues(clients, settings)
    data = write_input(tmp_path / "in", PRICES[:4])

    code, report = run_job(spark, data, tmp_path / "failed-1", settings, endpoint, capsys)
    assert (code, report["published"], report["failed"]) == (0, 3, 0)
    # A rerun of the step (within SNS FIFO's 5-minute window) publishes nothing twice.
    code, report = run_job(spark, data, tmp_path / "failed-2", settings, endpoint, capsys)
    assert (code, report["failed"]) == (0, 0)

    assert [depth(clients, queues[name]) for name in ("all_events", "mobile_events",
                                                      "apple_events")] == [3, 2, 2]
    messages = clients.client("sqs").receive_message(
        QueueUrl=queues["all_events"].queue.url, MaxNumberOfMessages=10,
        MessageAttributeNames=["All"], AttributeNames=["MessageGroupId"],
    )["Messages"]
    events = {
        (json.loads(m["Body"])["user_id"], json.loads(m["Body"])["item_id"]): m for m in messages
    }
    assert set(events) == {("u1", "I1"), ("u1", "I4"), ("u2", "I1")}
    first = events["u1", "I1"]
    assert json.loads(first["Body"]) == {
        "event": "price_drop", "user_id": "u1", "item_id": "I1", "category": "mobile",
        "brand": "Apple", "old_price": 1000.0, "new_price": 900.0, "drop_pct": 10.0,
        "price_date": "2026-11-21",
    }
    assert first["MessageAttributes"]["routing_key"]["StringValue"] == "MOBILE.APPLE"
    assert first["Attributes"]["MessageGroupId"] == "u1"
    assert events["u1", "I4"]["MessageAttributes"]["routing_key"]["StringValue"] == "LAPTOP.LENOVO"


def test_price_drop_job_exits_non_zero_with_failed_rows_kept(
    spark: SparkSession, settings: Settings, clients: ClientFactory, endpoint: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    queues = exchange_queues(clients, settings)
    data = write_input(tmp_path / "in", PRICES)

    code, report = run_job(spark, data, tmp_path / "failed", settings, endpoint, capsys)

    assert (code, report["published"], report["failed"]) == (1, 3, 1)
    (row,) = spark.read.json(str(tmp_path / "failed")).collect()
    assert (row["user_id"], row["item_id"], row["_failure_code"]) == ("u3", "I5", "InvalidMessage")
    assert depth(clients, queues["all_events"]) == 3


def test_sample_data_has_the_asked_size_and_price_drops(spark: SparkSession) -> None:
    import datetime

    wishlist, prices = generate_sample_data.generate(spark, 2_000, datetime.date(2026, 11, 21))

    assert wishlist.count() == wishlist.dropDuplicates().count() == 2_000
    assert prices.count() == 2 * generate_sample_data.catalogue_size(2_000)
    drops = wishlist_price_drops.find_price_drops(wishlist, prices).collect()
    assert 300 < len(drops) < 900  # about 30 % of wishlisted items drop
    assert all(5.0 <= row["drop_pct"] <= 30.0 for row in drops)
    assert {row["routing_key"] for row in drops} <= {
        f"{category}.{brand}" for category, brand in generate_sample_data.PRODUCTS
    }


def test_report_exit_code_and_ratio() -> None:
    assert PublishReport(10, 0, 0, 2, "p").exit_code == 0
    assert PublishReport(10, 0, 1, 2, "p").requests_per_message == 0.2


def test_row_mapping_makes_json_ready_items_and_stable_dedup_ids() -> None:
    import datetime
    from decimal import Decimal

    from pyspark.sql import Row


    mapping = RowMapping(routing_key="key", group_id="user", dedup_key=["user", "day"])
    row = Row(user=7, day=datetime.date(2026, 11, 21), price=Decimal("9.90"), key="TV.LG")

    item = mapping.item(row)

    assert item.body == {"user": 7, "day": "2026-11-21", "price": "9.90", "key": "TV.LG"}
    assert (item.routing_key, item.group_id) == ("TV.LG", "7")
    assert item.dedup_id == mapping.item(Row(**{**row.asDict(), "price": Decimal("1")})).dedup_id
    assert item.dedup_id != mapping.item(Row(**{**row.asDict(), "user": 8})).dedup_id
    assert len(item.dedup_id or "") == 64


# -- re-runs, failed-output leftovers, parallelism ---------------------------------------------
def audit_rows(spark: SparkSession, count: int, bad: int = 0) -> Any:
    """`count` rows for the audit queue; the first `bad` have a routing key SNS/SQS refuse."""
    rows = [(n, ("x" * 300) if n < bad else "A.B") for n in range(count)]
    return spark.createDataFrame(rows, "n int, key string")


def audit_queue(clients: ClientFactory, settings: Settings) -> ChannelResources:
    return Provisioner(clients, settings).ensure_channel(
        ChannelSpec(name="audit.log", namespace=settings.namespace)
    )


def test_a_rerun_of_a_run_publishes_only_what_it_has_not_published(
    spark: SparkSession, settings: Settings, clients: ClientFactory, executor: ExecutorSettings,
    tmp_path: Path,
) -> None:
    # Given a standard exchange (no deduplication: only the ledger can prevent duplicates),
    # a ledger in S3, and 300 rows of which 12 cannot be published
    queue = audit_queue(clients, settings)
    clients.client("s3").create_bucket(Bucket="jobs")
    df = audit_rows(spark, 300, bad=12)
    run = {"run_id": "audit-2026-11-21", "ledger": "s3://jobs/data/ledger", "partitions": 3}

    first = publish(df, AuditProducer, routing_key="key", failed_path=str(tmp_path / "f1"),
                    executor=executor, **run)
    # When the same run is published again, much later (as a retried step would)
    second = publish(df, AuditProducer, routing_key="key", failed_path=str(tmp_path / "f2"),
                     executor=executor, **run)

    # Then the second run skipped every published row and retried only the failed ones
    assert (first.published, first.failed, first.skipped) == (288, 12, 0)
    assert (second.published, second.failed, second.skipped) == (0, 12, 288)
    assert depth(clients, queue) == 288
    # The ledger: a few objects per partition, under the run id
    listed = clients.client("s3").list_objects_v2(Bucket="jobs", Prefix="data/ledger/")
    keys = [item["Key"] for item in listed["Contents"]]
    assert {key.split("/")[3] for key in keys} == {"3-0", "3-1", "3-2"}
    assert all(key.startswith("data/ledger/audit-2026-11-21/") for key in keys)
    # Another run id is another run: it publishes everything again
    third = publish(df, AuditProducer, routing_key="key", failed_path=str(tmp_path / "f3"),
                    executor=executor, **{**run, "run_id": "audit-2026-11-22"})
    assert (third.published, third.skipped) == (288, 0)


def test_a_run_resumes_only_with_its_own_partitions(
    spark: SparkSession, settings: Settings, clients: ClientFactory, executor: ExecutorSettings,
    tmp_path: Path,
) -> None:
    audit_queue(clients, settings)
    df = audit_rows(spark, 40)
    ledger = str(tmp_path / "ledger")
    publish(df, AuditProducer, routing_key="key", failed_path=str(tmp_path / "f1"),
            executor=executor, run_id="r1", ledger=ledger, partitions=2)

    with pytest.raises(ValueError, match=r"run 'r1' was published with partitions=2"):
        publish(df, AuditProducer, routing_key="key", failed_path=str(tmp_path / "f2"),
                executor=executor, run_id="r1", ledger=ledger, partitions=3)
    with pytest.raises(ValueError, match="run_id=, ledger="):
        publish(df, AuditProducer, failed_path=str(tmp_path / "f3"), run_id="r1")
    with pytest.raises(ValueError, match="run_id must be"):
        publish(df, AuditProducer, failed_path=str(tmp_path / "f4"), run_id="../x",
                ledger=ledger)


def test_failed_output_left_by_a_killed_run_is_replaced_a_completed_one_kept(
    spark: SparkSession, settings: Settings, clients: ClientFactory, executor: ExecutorSettings,
    tmp_path: Path,
) -> None:
    audit_queue(clients, settings)
    df = audit_rows(spark, 20, bad=2)
    # Given what a killed run leaves: _temporary with a task's attempt, no _SUCCESS
    killed = tmp_path / "failed"
    (killed / "_temporary" / "0" / "_temporary").mkdir(parents=True)
    (killed / "_temporary" / "0" / "part-00000.json").write_text('{"n": 99}\n')

    # When the run is repeated to the same path, it writes the failed rows there
    report = publish(df, AuditProducer, routing_key="key", failed_path=str(killed),
                     executor=executor)
    assert report.failed == 2
    assert sorted(r["n"] for r in spark.read.json(str(killed)).collect()) == [0, 1]
    assert (killed / "_SUCCESS").is_file()

    # A completed run's output is never overwritten, nor is a folder of other files
    with pytest.raises(ValueError, match=r"completed run's failed rows \(_SUCCESS\)"):
        publish(df, AuditProducer, routing_key="key", failed_path=str(killed), executor=executor)
    other = tmp_path / "data"
    other.mkdir()
    (other / "wishlist.csv").write_text("user_id,item_id\n")
    with pytest.raises(ValueError, match="no publish run wrote.*wishlist.csv"):
        publish(df, AuditProducer, routing_key="key", failed_path=str(other), executor=executor)
    assert (other / "wishlist.csv").is_file()


def test_publishing_uses_the_partitions_asked_for_whatever_adaptive_execution_does(
    spark: SparkSession, settings: Settings, clients: ClientFactory, executor: ExecutorSettings,
    tmp_path: Path,
) -> None:
    # Given adaptive query execution on (it coalesced `repartition(group)` of 50k rows to one
    # task), and a small ordered DataFrame of 64 groups (the exchange has no queue: moto's FIFO
    # queues slow down with depth, and the report counts what SNS took)
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
    rows = [(f"u{n % 64}", n) for n in range(128)]
    df = spark.createDataFrame(rows, "user_id string, seq int").coalesce(1)

    # When it is published with 6 partitions, and with the default (local[2]: 2)
    six = publish(df, DropProducer, group_id="user_id", dedup_key=["user_id", "seq"],
                  failed_path=str(tmp_path / "f6"), executor=executor, partitions=6)
    default = publish(df, DropProducer, group_id="user_id", dedup_key=["user_id", "seq"],
                      failed_path=str(tmp_path / "f2"), executor=executor)

    # Then 6 (and 2) tasks published
    assert (six.partitions, six.published) == (6, 128)
    assert default.partitions == spark.sparkContext.defaultParallelism == 2
    with pytest.raises(ValueError, match="partitions=.*from 1 to 10000, got 0"):
        publish(df, DropProducer, failed_path=str(tmp_path / "f0"), partitions=0)


def test_rows_that_sqs_would_drop_as_duplicates_are_reported_as_such(
    spark: SparkSession, settings: Settings, executor: ExecutorSettings, tmp_path: Path,
) -> None:
    # Given an ordered DataFrame in which one row repeats another's deduplication key
    rows = [("u0", 1, "a"), ("u0", 1, "b"), ("u1", 2, "c")]
    df = spark.createDataFrame(rows, "user_id string, seq int, note string")
    # When it is published (SNS would accept the repeat and drop it)
    report = publish(df, DropProducer, group_id="user_id", dedup_key=["user_id", "seq"],
                     failed_path=str(tmp_path / "failed"), executor=executor)
    # Then the repeat counts as a duplicate, not as published
    assert (report.published, report.duplicates, report.failed) == (2, 1, 0)


class TrackedAudit(MultiProducer):
    channel = "audit"
    track_status = True


def test_every_published_row_is_queued_in_the_status_table(
    spark: SparkSession, settings: Settings, clients: ClientFactory, executor: ExecutorSettings,
    tmp_path: Path,
) -> None:
    # Given 95 rows in 2 partitions: no partition holds a whole number of 25-record batches
    from messenger.channel import status_table_name
    from messenger.jobs.status import StatusStore

    Provisioner(clients, settings).ensure_channel(
        ChannelSpec(name="audit.log", namespace=settings.namespace)
    )
    StatusStore(clients, settings).ensure_table()
    df = spark.createDataFrame([(n, "AUDIT.ROW") for n in range(95)], "n int, routing_key string")

    report = publish(df.repartition(2), TrackedAudit, routing_key="routing_key",
                     failed_path=str(tmp_path / "failed"), executor=executor)

    # Then every published message has its QUEUED record once the job returns
    assert report.published == 95
    pages = clients.client("dynamodb").get_paginator("scan").paginate(
        TableName=status_table_name(settings.namespace)
    )
    queued = [item["message_id"]["S"] for page in pages for item in page["Items"]
              if item["event"]["S"] == "QUEUED"]
    assert len(queued) == len(set(queued)) == 95


def test_each_rows_message_carries_the_drivers_trace_context(
    spark: SparkSession, settings: Settings, clients: ClientFactory, executor: ExecutorSettings,
    tmp_path: Path,
) -> None:
    from opentelemetry import trace

    from tests.integration.helpers import drain
    from tests.otel import in_memory_spans

    # Given a driver that traces (its executors, Python workers of their own, do not)
    queue = Provisioner(clients, settings).ensure_channel(
        ChannelSpec(name="audit.traced", namespace=settings.namespace))
    df = spark.createDataFrame([(n, "AUDIT.ROW") for n in range(30)], "n int, routing_key string")
    with in_memory_spans():
        with trace.get_tracer("test").start_as_current_span("nightly export") as export:
            report = publish(df, AuditProducer, routing_key="routing_key",
                             failed_path=str(tmp_path / "failed"), executor=executor)
    assert report.published == 30
    # Then every message carries the driver's span as its parent: one trace for the whole job
    context = export.get_span_context()
    messages = drain(clients.client("sqs"), queue.queue.url)
    assert len(messages) == 30
    for message in messages:
        headers = json.loads(message["MessageAttributes"]["meta_headers"]["StringValue"])
        assert headers["traceparent"].split("-")[1:3] == \
            [f"{context.trace_id:032x}", f"{context.span_id:016x}"]


# -- re-runs with a run key ------------------------------------------------------------------------
#: The Python worker publishing a partition dies (os._exit) when it prepares this row.
KILL_AT_ROW = 120
RERUN_ROWS = 400
RERUN_USERS = 40


class KilledMidPartition(Producer):
    """A standard queue whose publishing task dies in the middle of a partition, once.

    `meta_headers` runs for each row as its push_many call prepares it. The first instance (one
    per partition) to reach KILL_AT_ROW while the arming file exists takes that file (a rename:
    one winner), waits until every other partition of the run is recorded finished (so no
    other task is cancelled in flight), then ends its process: the task, and so the job, fail
    as when an executor dies. Rows of its earlier push_many calls were sent and marked sent;
    the rows of the call being prepared were not claimed yet."""

    channel = "rerun_standard"
    fault_file = ""  # set per test, read on the executors (the class is pickled by value)
    run_key = ""

    def meta_headers(self) -> dict[str, str]:
        self.rows_prepared = getattr(self, "rows_prepared", 0) + 1
        if self.rows_prepared == KILL_AT_ROW and self.fault_file:
            try:
                os.rename(self.fault_file, f"{self.fault_file}.fired")
            except FileNotFoundError:
                return {}
            from messenger.jobs.runs import RunLedger

            ledger = RunLedger(self.clients, self.settings, self.run_key)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                summary = ledger.summary()
                if summary is not None and summary.finished == summary.partitions - 1:
                    break
                time.sleep(0.2)
            os._exit(17)
        return {}


class KilledMidPartitionOrdered(KilledMidPartition):
    channel = "rerun_ordered"
    ordered = True


@pytest.mark.parametrize("producer_class", [KilledMidPartition, KilledMidPartitionOrdered],
                         ids=["standard", "ordered"])
def test_a_step_killed_mid_partition_and_rerun_delivers_every_row_once(
    spark: SparkSession, settings: Settings, clients: ClientFactory, executor: ExecutorSettings,
    tmp_path: Path, producer_class: type[KilledMidPartition],
) -> None:
    from messenger.jobs.runs import RunLedger
    from tests.integration.helpers import drain

    # Given a channel, 400 rows of 40 users in 2 partitions, and a fault armed that kills the
    # Python worker of one partition when it prepares its 120th row
    sqs = clients.client("sqs")
    resources = Provisioner(clients, settings).ensure_channel(ChannelSpec(
        name=producer_class.channel, ordered=producer_class.ordered,
        namespace=settings.namespace))
    run_key = f"rerun-{producer_class.channel}"
    fault = tmp_path / "fault-armed"
    fault.write_text("armed")
    producer = type(producer_class.__name__, (producer_class,),
                    {"fault_file": str(fault), "run_key": run_key, "__module__": __name__})
    rows = [(f"u{n % RERUN_USERS}", n // RERUN_USERS, n) for n in range(RERUN_ROWS)]
    df = spark.createDataFrame(rows, "user_id string, seq int, n int")
    options: dict[str, Any] = dict(
        body=["user_id", "seq", "n"], group_id="user_id", dedup_key=["user_id", "seq"],
        order_by=["seq"], failed_path=str(tmp_path / "failed"), executor=executor,
        partitions=2, lanes=1, run_key=run_key)

    # When the step runs, and its job fails in the middle of a partition
    with pytest.raises(Exception, match="(?i)python worker|exit|crash"):
        publish(df, producer, **options)
    assert fault.with_name("fault-armed.fired").exists() and not fault.exists()
    # ... the queue is drained: every message SQS took is received and deleted. SQS's FIFO
    # deduplication window (5 minutes) counts as passed: the local SQS, as SQS after that
    # window, no longer drops a resend of a deleted message, so a row sent twice shows twice.
    first = [json.loads(m["Body"])["n"] for m in drain(sqs, resources.queue.url)]
    assert 0 < len(first) < RERUN_ROWS
    # ... and the step is re-run with the same run key (the killed run's failed output replaced)
    report = publish(df, producer, **options)
    second = drain(sqs, resources.queue.url)

    # Then every row was delivered, none twice: the re-run sent exactly the rows the killed
    # run had not, skipped the partition that had finished without a read per row, and looked
    # up the killed partition's rows in the dedup table
    delivered = first + [json.loads(m["Body"])["n"] for m in second]
    assert sorted(delivered) == list(range(RERUN_ROWS))
    assert (report.published, report.failed, report.duplicates) == \
        (RERUN_ROWS - len(first), 0, 0)
    assert report.skipped == len(first)
    assert report.partitions_skipped == 1
    # Each user's rows arrived in order across the two runs (ordered: one FIFO group each)
    if producer_class.ordered:
        order: dict[str, list[int]] = {}
        for n in delivered:
            order.setdefault(f"u{n % RERUN_USERS}", []).append(n // RERUN_USERS)
        assert all(seqs == sorted(seqs) for seqs in order.values())
    # The run's ledger: both partitions finished, the rows published and skipped in all
    summary = RunLedger(clients, settings, run_key).summary()
    assert summary is not None
    assert (summary.finished, summary.partitions, summary.attempts) == (2, 2, 1)
    assert summary.counts["published"] + summary.counts["skipped"] == RERUN_ROWS
    # ... the killed partition had sent its first two push_many calls of 50 rows, in full
    finished_first = summary.counts["published"] - report.published
    assert summary.counts["skipped"] == len(first) - finished_first == 2 * RUN_CHUNK_ROWS
    # And a third run of the same run key sends nothing and reads no row's claim
    again = publish(df, producer, **{**options, "failed_path": str(tmp_path / "failed-3")})
    assert (again.published, again.skipped, again.partitions_skipped) == (0, RERUN_ROWS, 2)
    assert again.dynamodb_requests <= 2 * 2  # per partition: the table check, its record
    assert drain(sqs, resources.queue.url) == []


def test_price_drop_job_rerun_with_a_run_key_on_a_standard_exchange_sends_nothing_twice(
    spark: SparkSession, settings: Settings, clients: ClientFactory, endpoint: str,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a standard (not FIFO) wishlist exchange, which has no deduplication of its own
    queue = Provisioner(clients, settings).ensure_channel(ChannelSpec(
        name=f"{EXCHANGE}.all_events", namespace=settings.namespace))
    data = write_input(tmp_path / "in", PRICES[:4])
    argv = ["--input", str(data), "--format", "csv", "--namespace", settings.namespace,
            "--endpoint-url", endpoint, "--no-ordered", "--run-key", "auto",
            "--partitions", "2"]

    # When the step runs twice with the same (derived) run key
    reports = []
    for attempt in (1, 2):
        code = wishlist_price_drops.main(
            [*argv, "--failed-output", str(tmp_path / f"failed-{attempt}")], spark=spark)
        assert code == 0
        reports.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))

    # Then the second sent nothing: its partitions were finished ones, skipped whole
    assert (reports[0]["published"], reports[0]["skipped"]) == (3, 0)
    assert (reports[1]["published"], reports[1]["skipped"]) == (0, 3)
    assert reports[1]["partitions_skipped"] == 2
    assert reports[0]["run_key"] == reports[1]["run_key"]
    assert reports[0]["run_key"].startswith("wishlist_price_drops-")
    assert depth(clients, queue) == 3


def test_run_key_arguments_fail_on_the_driver(
    spark: SparkSession, settings: Settings, executor: ExecutorSettings, tmp_path: Path,
) -> None:
    from datetime import timedelta

    df = spark.createDataFrame([(1, "a")], "n int, note string")
    failed = str(tmp_path / "failed")
    with pytest.raises(ValueError, match="run_key must be 1 to 80"):
        publish(df, KilledMidPartition, failed_path=failed, executor=executor, run_key="a/b")
    for window in (0, 15 * 86_400, timedelta(seconds=1.5), 3.0):
        with pytest.raises(ValueError, match=r"run_window=\.\.\.\) must be a whole number"):
            publish(df, KilledMidPartition, failed_path=failed, executor=executor,
                    run_key="r", run_window=window)  # type: ignore[arg-type]
    # dedup_key on a standard channel needs a run key (the job id is derived from both)
    with pytest.raises(ValueError, match="ordered channels, or with a run_key"):
        publish(df, KilledMidPartition, failed_path=failed, executor=executor, dedup_key=["n"])
    assert not (tmp_path / "failed").exists()
