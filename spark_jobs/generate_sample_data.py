"""Sample input for wishlist_price_drops.py, of any size, deterministic for a given seed.

    python spark_jobs/generate_sample_data.py --rows 100000 --out /tmp/sample [--format csv]

Writes `OUT/wishlist` (user_id, item_id: exactly `--rows` rows, 8 items per user, no duplicate)
and `OUT/prices` (item_id, category, brand, price, price_date): every catalogue item priced on the
day before `--date` and on `--date`; about 30 % of items drop by 5-30 %, 15 % rise, the rest keep
their price.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from messenger.spark import spark_session

#: (category, brand) pairs of the catalogue; routing keys are '<CATEGORY>.<BRAND>'.
PRODUCTS = [
    ("MOBILE", "APPLE"), ("MOBILE", "SAMSUNG"), ("MOBILE", "GOOGLE"),
    ("LAPTOP", "APPLE"), ("LAPTOP", "LENOVO"), ("LAPTOP", "DELL"),
    ("TV", "SONY"), ("TV", "LG"), ("AUDIO", "BOSE"), ("AUDIO", "SONY"),
]
ITEMS_PER_USER = 8
_STRIDE = 7919  # prime: a user's 8 items are distinct whenever the catalogue is not a multiple


def _pick(seed: int, salt: int, modulus: int) -> F.Column:
    return F.pmod(F.hash(F.col("id"), F.lit(seed), F.lit(salt)), F.lit(modulus))


def catalogue_size(rows: int) -> int:
    size = max(ITEMS_PER_USER * 2, rows // 4)
    return size + 1 if size % _STRIDE == 0 else size


def generate(
    spark: SparkSession, rows: int, date: datetime.date, seed: int = 7
) -> tuple[DataFrame, DataFrame]:
    """(wishlist, prices) DataFrames; see the module docstring."""
    items = catalogue_size(rows)
    wishlist = spark.range(rows).select(
        F.format_string("U%07d", (F.col("id") / ITEMS_PER_USER).cast("long")).alias("user_id"),
        F.format_string("I%07d", F.pmod(F.col("id") * _STRIDE + seed, F.lit(items)))
        .alias("item_id"),
    )
    product = _pick(seed, 1, len(PRODUCTS)) + 1
    catalogue = spark.range(items).select(
        "id",
        F.format_string("I%07d", F.col("id")).alias("item_id"),
        F.element_at(F.array(*[F.lit(c) for c, _ in PRODUCTS]), product).alias("category"),
        F.element_at(F.array(*[F.lit(b) for _, b in PRODUCTS]), product).alias("brand"),
        (F.lit(20.0) + _pick(seed, 2, 200_000) / 100.0).alias("base"),
        _pick(seed, 3, 100).alias("change"),
        (5 + _pick(seed, 4, 26)).alias("drop_pct"),
    )
    today = (
        F.when(F.col("change") < 30, F.col("base") * (1 - F.col("drop_pct") / 100.0))
        .when(F.col("change") < 45, F.col("base") * 1.1)
        .otherwise(F.col("base"))
    )
    columns = ["item_id", "category", "brand"]
    prices = catalogue.select(
        *columns, F.round("base", 2).alias("price"),
        F.lit(date - datetime.timedelta(days=1)).alias("price_date"),
    ).unionByName(
        catalogue.select(
            *columns, F.round(today, 2).alias("price"), F.lit(date).alias("price_date")
        )
    )
    return wishlist, prices


def write(wishlist: DataFrame, prices: DataFrame, out: str, fmt: str) -> None:
    for name, frame in (("wishlist", wishlist), ("prices", prices)):
        writer = frame.write.mode("overwrite")
        if fmt == "csv":
            writer.csv(f"{out}/{name}", header=True)
        else:
            writer.parquet(f"{out}/{name}")


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, required=True, help="wishlist rows (>= 1)")
    parser.add_argument("--out", required=True, help="output directory (overwritten)")
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    parser.add_argument("--date", type=datetime.date.fromisoformat,
                        default=datetime.date.today(), help="price date YYYY-MM-DD (default today)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error(f"--rows must be at least 1, got {args.rows}")
    spark = spark or spark_session("generate_sample_data")
    write(*generate(spark, args.rows, args.date, args.seed), args.out, args.format)
    prices = 2 * catalogue_size(args.rows)
    print(f"wrote {args.rows} wishlist rows and {prices} prices to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
