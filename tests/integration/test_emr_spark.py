"""The price-drop job as an EMR step runs it: `spark-submit --py-files messenger.zip` with the
release's Spark (pyspark 3.5.5 for emr-7.9.0) on Python 3.11 chosen by `spark.pyspark.python`,
in an interpreter holding only pyspark and boto3, publishing to the moto server.

One Spark run in a subprocess (the main suite's Spark is pyspark 4, in process).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

from messenger import ChannelSpec, Settings
from messenger.aws import ClientFactory
from messenger.provision import Provisioner
from messenger.tools.emr import package_zip, python_confs
from stacks.emr_pipeline import DEFAULT_RELEASE_LABEL, RELEASE_SPARK
from tests.emr_env import EMR_PYTHON, ROOT, emr_python

JOB = ROOT / "spark_jobs" / "wishlist_price_drops.py"


def write_input(base: Path) -> Path:
    rows = {"wishlist": [("user_id", "item_id"), ("u1", "I1"), ("u1", "I2"), ("u2", "I1")],
            "prices": [("item_id", "category", "brand", "price", "price_date"),
                       ("I1", "mobile", "Apple", 1000.0, "2026-11-20"),
                       ("I1", "mobile", "Apple", 900.0, "2026-11-21"),
                       ("I2", "tv", "Sony", 500.0, "2026-11-20"),
                       ("I2", "tv", "Sony", 300.0, "2026-11-21")]}
    for name, lines in rows.items():
        (base / name).mkdir(parents=True)
        with open(base / name / "part-0.csv", "w", newline="") as out:
            csv.writer(out).writerows(lines)
    return base


def test_the_release_spark_is_the_tested_spark() -> None:
    python = emr_python(EMR_PYTHON)
    version = subprocess.run(
        [str(python), "-c", "import pyspark; print(pyspark.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert version == RELEASE_SPARK[DEFAULT_RELEASE_LABEL] == "3.5.5"
    pins = (ROOT / "requirements-emr.txt").read_text()
    assert f'pyspark=={version}; python_version >= "3.10"' in pins


def test_the_job_runs_from_the_zip_on_spark_3_5_and_records_what_it_published(
    settings: Settings, clients: ClientFactory, endpoint: str, tmp_path: Path,
) -> None:
    # Given the exchange with one queue, the job's input, and the zip emr submit uploads
    python = emr_python(EMR_PYTHON)
    queue = Provisioner(clients, settings).ensure_channel(ChannelSpec(
        name="wishlist_events.all_events", ordered=True, namespace=settings.namespace,
    ))
    data = write_input(tmp_path / "in")
    archive = tmp_path / "messenger.zip"
    archive.write_bytes(package_zip())
    env = {
        # spark-submit finds Spark with the `python3` first on PATH: the EMR interpreter's
        "PATH": f"{python.parent}:{os.environ['PATH']}",
        "JAVA_HOME": os.environ.get("JAVA_HOME", ""),
        "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "MESSENGER_NAMESPACE": settings.namespace,
    }
    ledger = tmp_path / "ledger"

    def run(failed: str) -> dict:
        # When spark-submit runs the job as the step does (the interpreter chosen by conf)
        done = subprocess.run(
            [str(python.parent / "spark-submit"), "--master", "local[2]",
             "--conf", "spark.ui.enabled=false", *python_confs(str(python)),
             "--py-files", str(archive), str(JOB),
             "--input", str(data), "--format", "csv", "--failed-output", str(tmp_path / failed),
             "--endpoint-url", endpoint, "--ledger", str(ledger), "--partitions", "3"],
            cwd=tmp_path, env={k: v for k, v in env.items() if v}, capture_output=True,
            text=True, timeout=240,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    report = run("failed")

    # Then the three drops (u1: I1 and I2, u2: I1) went out from the 3 partitions asked for
    # (at most: 3 rows), and the ledger holds them for a re-run (test_spark.py re-runs)
    assert (report["published"], report["failed"], report["skipped"]) == (3, 0, 0)
    assert 1 <= report["partitions"] <= 3
    recorded = [json.loads(p.read_text()) for p in ledger.glob(f"{report['run_id']}/3-*/*.json")]
    assert sum(len(digests) for digests in recorded) == 3
    depth = clients.client("sqs").get_queue_attributes(
        QueueUrl=queue.queue.url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]["ApproximateNumberOfMessages"]
    assert depth == "3"
