"""messenger.spark's partition publisher with a run key, on its own (no SparkSession), against
the moto server: a finished partition is skipped whole on a re-run, and one whose rows changed
under the same run key is refused instead of skipped. Counters stand in for Spark's
accumulators."""

from __future__ import annotations

from typing import Any

import pytest

from messenger import ChannelSpec, Producer, Settings
from messenger.aws import ClientFactory
from messenger.errors import InvalidSettings
from messenger.provision import Provisioner
from messenger.spark import COUNTERS, ExecutorSettings, PartitionPublisher, RowMapping, RunSpec

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import Row  # noqa: E402


class RunQueue(Producer):
    channel = "run_partitions"


class Total:
    def __init__(self) -> None:
        self.value = 0

    def add(self, value: int) -> None:
        self.value += value


def run_partition(settings: Settings, endpoint: str, rows: list[Any], run: RunSpec
                  ) -> tuple[dict[str, int], list[Any]]:
    counters = {name: Total() for name in COUNTERS}
    task = PartitionPublisher(RunQueue, ExecutorSettings(settings, endpoint), RowMapping(
        body=["n"], dedup_key=["n"], run_key=run.run_key), counters, run=run)
    failed = list(task(0, iter(rows)))
    return {name: total.value for name, total in counters.items()}, failed


def test_a_finished_partition_is_skipped_whole_and_a_changed_one_refused(
    settings: Settings, clients: ClientFactory, endpoint: str,
) -> None:
    queue = Provisioner(clients, settings).ensure_channel(
        ChannelSpec(name=RunQueue.channel, namespace=settings.namespace))
    run = RunSpec("nightly-7", RunQueue.channel, partitions=1)
    run.ledger(clients, settings).start()
    rows = [Row(n=n) for n in range(120)]

    # The first attempt sends every row and records the partition finished
    first, failed = run_partition(settings, endpoint, rows + [Row(n=5)], run)
    assert failed == []
    assert (first["published"], first["duplicates"], first["skipped"]) == (120, 1, 0)
    assert first["dynamodb_requests"] <= 120 + 2 * 3 + 4  # claims, marks, table checks, ledger
    # A re-run reads the partition's record only: nothing sent, no claim read
    again, _ = run_partition(settings, endpoint, list(reversed(rows)) + [Row(n=5)], run)
    assert (again["published"], again["skipped"], again["partitions_skipped"]) == (0, 121, 1)
    assert again["dynamodb_requests"] == 2  # the table check and the partition's record
    depth = clients.client("sqs").get_queue_attributes(
        QueueUrl=queue.queue.url, AttributeNames=["ApproximateNumberOfMessages"])
    assert depth["Attributes"]["ApproximateNumberOfMessages"] == "120"
    # Other rows under the same run key (the input changed) are refused, never skipped
    with pytest.raises(InvalidSettings,
                       match=r"run_key 'nightly-7': partition 0 holds other rows .*121 now"):
        run_partition(settings, endpoint, rows + [Row(n=999)], run)
