"""Price drops on wishlisted items: one event per (user, item) on the wishlist exchange.

    spark-submit --py-files messenger.zip spark_jobs/wishlist_price_drops.py \
        --input s3://bucket/sample --failed-output s3://bucket/failed/run-42
    python spark_jobs/wishlist_price_drops.py --input /tmp/sample --failed-output /tmp/failed

Input (`--input DIR`, Parquet or CSV): `DIR/wishlist` (user_id, item_id) and `DIR/prices`
(item_id, category, brand, price, price_date); `generate_sample_data.py` writes both.
A drop: an item's price on `--date` (default: the latest date in the feed) is at least
`--min-drop-pct` below its previous price. Each drop on a user's wishlist becomes one event,
routing key `<CATEGORY>.<BRAND>`, FIFO group the user, dedup id sha256(user|item|date), so rerunning
the step within 5 minutes publishes nothing twice; with `--ledger` (an s3:// URI or a folder) a
re-run at any later time skips what the run already published (run id: `--run-id`, by default
derived from the arguments that choose the events). With `--run-key KEY` (or `auto`: derived as
the run id) each event's job id is derived from the key and (user, item, date), pushed with dedup
on enqueue for `--run-window-days` (default 7): a re-run of a failed step with the same key, on an
ordered or a standard exchange, sends only the events not sent before, and skips whole the
partitions an earlier attempt finished (`messenger emr run KEY` shows the counts). Rows that fail
land in `--failed-output`; the job then exits 1. `--partitions`: publishing tasks (default: the
cluster's parallelism).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, DoubleType, StringType, StructField, StructType

from messenger.produce.producer import MultiProducer
from messenger.spark import ExecutorSettings, publish, spark_session

WISHLIST_SCHEMA = StructType(
    [StructField("user_id", StringType(), False), StructField("item_id", StringType(), False)]
)
PRICES_SCHEMA = StructType(
    [
        StructField("item_id", StringType(), False),
        StructField("category", StringType(), True),
        StructField("brand", StringType(), True),
        StructField("price", DoubleType(), False),
        StructField("price_date", DateType(), False),
    ]
)
EVENT_COLUMNS = [
    "event", "user_id", "item_id", "category", "brand", "old_price", "new_price", "drop_pct",
    "price_date",
]


class WishlistEventProducer(MultiProducer):
    """The wishlist exchange (ordered: each user's events in order)."""

    channel = "wishlist_events"
    ordered = True

    def meta_headers(self) -> dict[str, str]:
        return {"source": "spark_jobs/wishlist_price_drops"}


def producer_for(channel: str, ordered: bool) -> type[MultiProducer]:
    """WishlistEventProducer, or a subclass of it publishing to another exchange."""
    if (channel, ordered) == (WishlistEventProducer.channel, WishlistEventProducer.ordered):
        return WishlistEventProducer
    return type(  # pickled by value: the executors need not import this module
        "WishlistEventProducer", (WishlistEventProducer,), {"channel": channel, "ordered": ordered}
    )


def read_inputs(spark: SparkSession, path: str, fmt: str) -> tuple[DataFrame, DataFrame]:
    def read(name: str, schema: StructType) -> DataFrame:
        if fmt == "csv":
            return spark.read.csv(f"{path}/{name}", schema=schema, header=True)
        return spark.read.parquet(f"{path}/{name}")

    return read("wishlist", WISHLIST_SCHEMA), read("prices", PRICES_SCHEMA)


def routing_key_column(category: str, brand: str) -> Any:
    """'<CATEGORY>.<BRAND>': upper case, spaces as '_', 'UNKNOWN' for a missing value."""

    def part(column: str) -> Any:
        return F.coalesce(F.upper(F.regexp_replace(F.trim(F.col(column)), r"\s+", "_")),
                          F.lit("UNKNOWN"))

    return F.concat_ws(".", part(category), part(brand))


def find_price_drops(
    wishlist: DataFrame, prices: DataFrame, date: str | None = None, min_drop_pct: float = 5.0
) -> DataFrame:
    """One row per (user, wishlisted item) whose price fell by at least `min_drop_pct` percent
    on `date` (default: the feed's latest date) compared with the item's previous price."""
    history = prices.withColumn(
        "old_price", F.lag("price").over(Window.partitionBy("item_id").orderBy("price_date"))
    )
    if date is None:
        day = history.agg(F.max("price_date").alias("day"))
        history = history.join(day, history.price_date == day.day).drop("day")
    else:
        history = history.where(F.col("price_date") == F.to_date(F.lit(date)))
    drops = history.where(
        F.col("old_price").isNotNull()
        & (F.col("price") <= F.col("old_price") * (1 - min_drop_pct / 100.0))
    )
    return (
        wishlist.dropDuplicates(["user_id", "item_id"])
        .join(drops, "item_id")
        .select(
            F.lit("price_drop").alias("event"),
            "user_id", "item_id", "category", "brand", "old_price",
            F.col("price").alias("new_price"),
            F.round((1 - F.col("price") / F.col("old_price")) * 100, 1).alias("drop_pct"),
            F.date_format("price_date", "yyyy-MM-dd").alias("price_date"),
            routing_key_column("category", "brand").alias("routing_key"),
        )
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, help="directory with wishlist/ and prices/")
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    parser.add_argument("--failed-output", required=True,
                        help="where rows that could not be published are written (must not exist)")
    parser.add_argument("--date", default=None, help="price date YYYY-MM-DD (default: latest)")
    parser.add_argument("--min-drop-pct", type=float, default=5.0, help="default 5")
    parser.add_argument("--channel", default=WishlistEventProducer.channel,
                        help="exchange to publish to (default wishlist_events)")
    parser.add_argument("--ordered", action=argparse.BooleanOptionalAction, default=True,
                        help="the exchange is ordered (FIFO; default yes)")
    parser.add_argument("--namespace", default=None, help="default: MESSENGER_NAMESPACE")
    parser.add_argument("--region", default=None, help="default: AWS_REGION / AWS_DEFAULT_REGION")
    parser.add_argument("--endpoint-url", default=None, help="default: AWS_ENDPOINT_URL")
    parser.add_argument("--provisioning", choices=("auto", "verify"), default=None,
                        help="default: MESSENGER_PROVISIONING")
    parser.add_argument("--partitions", type=int, default=None,
                        help="publishing tasks (default: the cluster's default parallelism)")
    parser.add_argument("--ledger", default=None,
                        help="s3:// URI or folder recording what each run published, so a "
                             "re-run publishes nothing twice (default: none)")
    parser.add_argument("--run-id", default=None,
                        help="the run's id in the ledger (default: derived from --input, "
                             "--date, --min-drop-pct and --channel)")
    parser.add_argument("--run-key", default=None,
                        help="re-runnable run: events' job ids derived from it, deduplicated on "
                             "enqueue ('auto': derived as the run id; default: none)")
    parser.add_argument("--run-window-days", type=int, default=7,
                        help="days a run key's events count as sent (1 to 14, default 7)")
    return parser


def default_run_id(args: argparse.Namespace) -> str:
    """The same events give the same id: a re-run of the step is recognised as such."""
    chosen = [args.input, args.date, args.min_drop_pct, args.channel, args.ordered]
    digest = hashlib.sha256(json.dumps(chosen).encode("utf-8")).hexdigest()[:16]
    return f"wishlist_price_drops-{digest}"


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    """Run the job; returns the exit code (1 when any event failed). Prints the report as JSON."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0 <= args.min_drop_pct < 100:
        parser.error(f"--min-drop-pct must be from 0 to below 100, got {args.min_drop_pct}")
    if args.run_id and not args.ledger:
        parser.error("--run-id needs --ledger (where the run's published rows are recorded)")
    if not 1 <= args.run_window_days <= 14:
        parser.error(f"--run-window-days must be from 1 to 14, got {args.run_window_days}")
    run_key = default_run_id(args) if args.run_key == "auto" else args.run_key
    overrides = {
        name: value
        for name, value in (
            ("namespace", args.namespace), ("region", args.region),
            ("provisioning", args.provisioning),
        )
        if value is not None
    }
    executor = ExecutorSettings.from_env(endpoint_url=args.endpoint_url, **overrides)
    spark = spark or spark_session("wishlist_price_drops")
    wishlist, prices = read_inputs(spark, args.input, args.format)
    drops = find_price_drops(wishlist, prices, args.date, args.min_drop_pct)
    producer = producer_for(args.channel, args.ordered)
    report = publish(
        drops,
        producer,
        body=EVENT_COLUMNS,
        routing_key="routing_key",
        group_id="user_id" if args.ordered else None,
        dedup_key=["user_id", "item_id", "price_date"] if args.ordered or run_key else None,
        order_by=["item_id"] if args.ordered else (),
        failed_path=args.failed_output,
        executor=executor,
        partitions=args.partitions,
        run_id=(args.run_id or default_run_id(args)) if args.ledger else None,
        ledger=args.ledger,
        run_key=run_key,
        run_window=args.run_window_days * 86_400,
    )
    print(json.dumps({"job": "wishlist_price_drops", **report.as_dict()}), flush=True)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
