"""Benchmark: a re-run of a finished publishing run (same run key) against the run itself.

    python bench/spark_rerun.py [--rows 5000] [--partitions 2] [--rounds 3] [--network-ms 0,10]

Starts a moto server (child process) and a local[2] SparkSession, then in each round publishes
`--rows` rows to a standard queue with `messenger.spark.publish(run_key=...)` (a new run key per
round: every row claimed in the dedup table, sent, its claim marked sent; each partition
recorded finished), and publishes the same DataFrame again with the same run key: every
partition is found finished in the run's ledger and skipped whole (one read per partition, no
read per row). A warm-up run (its own run key, 200 rows) starts the JVM and the Python workers
first. DynamoDB requests are counted with botocore's `before-send` event: on the executors
(`PublishReport.dynamodb_requests`, messenger.aws.RequestCounter) and on the driver (the run's
record and its attempt), and divided by the rows of the first run.

Targets: speedup (first run's seconds over the re-run's, per round, the median) >= 10, and
DynamoDB requests per row of the first run <= 1.1. With `--network-ms` (as bench/spark_publish.py,
a round trip slept before each request the Python workers send) the first run pays a round trip
per claim, as on EMR; 0 is bare loopback, where moto's CPU bounds the first run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pyspark.sql import SparkSession  # noqa: E402

from bench.spark_publish import NETWORK_MS_ENV, local_spark  # noqa: E402
from messenger import Producer  # noqa: E402
from messenger.aws import RequestCounter  # noqa: E402
from messenger.spark import ExecutorSettings, PublishReport, publish  # noqa: E402


class RerunBench(Producer):
    channel = "bench_rerun"


def dynamodb(counter: RequestCounter) -> int:
    return sum(count for key, count in counter.counts.items() if key.startswith("dynamodb."))


def timed_publish(df: Any, executor: ExecutorSettings, run_key: str, partitions: int,
                  failed_path: str) -> tuple[PublishReport, float, int]:
    """Publish with `run_key`; the report, the seconds it took and the driver's DynamoDB
    requests."""
    counter = RequestCounter().attach(executor.client_factory())
    started = time.perf_counter()
    try:
        report = publish(df, RerunBench, body=["n", "user", "note"], dedup_key=["n"],
                         failed_path=failed_path, executor=executor, partitions=partitions,
                         run_key=run_key)
    finally:
        counter.detach(executor.client_factory())
    return report, time.perf_counter() - started, dynamodb(counter)


def run_round(spark: SparkSession, executor: ExecutorSettings, rows: int, partitions: int,
              name: str, scratch: str) -> dict[str, Any]:
    df = spark.createDataFrame([(n, f"u{n % 97}", "x" * 64) for n in range(rows)],
                               "n int, user string, note string").cache()
    df.count()  # the input is computed before the clock starts, for both runs alike
    first, first_seconds, first_driver = timed_publish(df, executor, name, partitions,
                                                       f"{scratch}/{name}-1")
    again, again_seconds, again_driver = timed_publish(df, executor, name, partitions,
                                                       f"{scratch}/{name}-2")
    df.unpersist()
    first_dynamodb = first.dynamodb_requests + first_driver
    return {
        "first": {"seconds": round(first_seconds, 3), "published": first.published,
                  "failed": first.failed, "dynamodb_requests": first_dynamodb,
                  "dynamodb_requests_per_row": round(first_dynamodb / rows, 4),
                  "requests": first.requests},
        "rerun": {"seconds": round(again_seconds, 3), "published": again.published,
                  "skipped": again.skipped, "partitions_skipped": again.partitions_skipped,
                  "dynamodb_requests": again.dynamodb_requests + again_driver},
        "speedup": round(first_seconds / again_seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--network-ms", default="0",
                        help="round trips added per request, one condition each (ms, comma list)")
    args = parser.parse_args(argv)
    conditions: dict[str, Any] = {}
    with local_spark("bench-spark-rerun", args.partitions) as (_, spark, executor, scratch):
        for network_ms in [float(value) for value in args.network_ms.split(",")]:
            spark.sparkContext.environment[NETWORK_MS_ENV] = str(network_ms)
            label = f"network_{network_ms:g}ms" if network_ms else "loopback"
            run_round(spark, executor, 200, args.partitions, f"warm-{label}", scratch)
            rounds = [run_round(spark, executor, args.rows, args.partitions,
                                f"round-{label}-{number}", scratch)
                      for number in range(args.rounds)]
            conditions[label] = {
                "rounds": rounds,
                "speedup_median": statistics.median(r["speedup"] for r in rounds),
                "dynamodb_requests_per_row": max(r["first"]["dynamodb_requests_per_row"]
                                                 for r in rounds),
            }
    print(json.dumps({
        "rows": args.rows, "partitions": args.partitions, "conditions": conditions,
        "targets": {"speedup_median": ">= 10", "dynamodb_requests_per_row": "<= 1.1"},
    }, indent=2))
    complete = all(r["first"]["failed"] == 0 and r["first"]["published"] == args.rows
                   and r["rerun"]["published"] == 0
                   for c in conditions.values() for r in c["rounds"])
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
