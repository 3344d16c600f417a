"""Benchmark: messenger.spark.publish against a per-row `push`, in the same local Spark run.

    python bench/spark_publish.py [--rows 5000] [--partitions 2]

Starts a moto server (child process) and a local[2] SparkSession, then publishes the same rows
to an ordered exchange twice: with `publish` (batches of 10 per partition) and with a plain
per-row `push` loop per partition. AWS requests are counted on the executors with botocore's
'before-send' event (messenger.aws.RequestCounter). Targets: requests_per_message <= 0.11 and
speedup_vs_push >= 5. The exchange has no subscribed queues: moto's SQS gets slower as a queue
fills, which would measure moto rather than the publisher.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql import SparkSession

from messenger import MultiProducer, Settings
from messenger.aws import RequestCounter
from messenger.spark import ExecutorSettings, publish
from messenger.tools.local import LOCAL_CREDENTIALS, start_local_process


class PublishBench(MultiProducer):
    channel = "bench_publish"
    ordered = True


class PushBench(MultiProducer):
    channel = "bench_push"
    ordered = True


def push_rows(executor: ExecutorSettings) -> Any:
    """The baseline: one producer per partition, one `push` (one request) per row."""

    def run(rows: Iterable[Any]) -> Iterator[tuple[int, int]]:
        clients = executor.client_factory()
        counter = RequestCounter().attach(clients)
        producer = PushBench(settings=executor.settings, clients=clients)
        pushed = 0
        for row in rows:
            producer.push(
                {"user_id": row["user_id"], "seq": row["seq"]}, routing_key=row["routing_key"],
                group_id=row["user_id"], dedup_id=f"{row['user_id']}-{row['seq']}",
            )
            pushed += 1
        yield pushed, counter.total

    return run


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used so far; None off Linux."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000)
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.update(LOCAL_CREDENTIALS)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    server = start_local_process()
    spark = (
        SparkSession.builder.master("local[2]").appName("bench-spark-publish")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(args.partitions))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        executor = ExecutorSettings(Settings(namespace="bench"), endpoint_url=server.url)
        rows = [(f"u{n % 100}", n // 100, "MOBILE.APPLE") for n in range(args.rows)]
        df = spark.createDataFrame(rows, "user_id string, seq int, routing_key string")
        df = df.repartition(args.partitions, "user_id").cache()
        df.count()  # materialize, and start the Python workers before timing anything

        pid = server.process.pid
        server_cpu = [cpu_seconds(pid)]
        started = time.perf_counter()
        counts = df.rdd.mapPartitions(push_rows(executor)).collect()
        push_seconds = time.perf_counter() - started
        server_cpu.append(cpu_seconds(pid))
        pushed, push_requests = sum(c[0] for c in counts), sum(c[1] for c in counts)

        with tempfile.TemporaryDirectory() as scratch:
            started = time.perf_counter()
            report = publish(
                df, PublishBench, body=["user_id", "seq"], routing_key="routing_key",
                group_id="user_id", dedup_key=["user_id", "seq"], order_by=["seq"],
                failed_path=f"{scratch}/failed", executor=executor,
                partitions=args.partitions,
            )
            publish_seconds = time.perf_counter() - started
            server_cpu.append(cpu_seconds(pid))
    finally:
        spark.stop()
        server.stop()
    figures = {
        "rows": args.rows,
        "partitions": args.partitions,
        "published": report.published,
        "failed": report.failed,
        "requests": report.requests,
        "requests_per_message": round(report.requests_per_message, 4),
        "publish_seconds": round(publish_seconds, 2),
        "push_seconds": round(push_seconds, 2),
        "push_requests_per_message": round(push_requests / max(pushed, 1), 4),
        "speedup_vs_push": round(push_seconds / publish_seconds, 2),
        # How much of each phase the moto server spent computing: near the wall time means
        # the figure measures moto's per-message cost, not the publisher.
        "moto_cpu_seconds": _phases(server_cpu),
        "targets": {"requests_per_message": "<= 0.11", "speedup_vs_push": ">= 5"},
    }
    print(json.dumps(figures, indent=2))
    return 0 if report.failed == 0 and pushed == args.rows else 1


def _phases(marks: list[float | None]) -> dict[str, float] | None:
    if any(mark is None for mark in marks):
        return None
    push, publish_ = marks[1] - marks[0], marks[2] - marks[1]  # type: ignore[operator]
    return {"push": round(push, 2), "publish": round(publish_, 2)}


if __name__ == "__main__":
    sys.exit(main())
