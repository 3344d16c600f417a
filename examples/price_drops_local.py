"""Generate sample data and run the price-drop job in ONE local SparkSession (one JVM start).

    python -m examples.price_drops_local --rows 400 --workdir DIR --endpoint-url URL --namespace NS

What `make demo` runs; on EMR the two are separate steps (see docs/spark.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "spark_jobs"))

import generate_sample_data  # noqa: E402
import wishlist_price_drops  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--endpoint-url", required=True)
    parser.add_argument("--namespace", required=True)
    args = parser.parse_args(argv)
    spark = (
        SparkSession.builder.master("local[2]").appName("price_drops_local")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    try:
        sample = f"{args.workdir}/sample"
        generate_sample_data.main(["--rows", str(args.rows), "--out", sample], spark=spark)
        return wishlist_price_drops.main(
            ["--input", sample, "--failed-output", f"{args.workdir}/failed-rows",
             "--endpoint-url", args.endpoint_url, "--namespace", args.namespace],
            spark=spark,
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
