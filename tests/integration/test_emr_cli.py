"""`messenger emr submit|status` against the moto server's EMR and S3 APIs."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from messenger.aws import ClientFactory
from messenger.tools.cli import main
from messenger.tools.emr import package_zip

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "spark_jobs" / "wishlist_price_drops.py"
BUCKET = "pipeline-code"


@pytest.fixture
def cluster(clients: ClientFactory) -> str:
    clients.client("s3").create_bucket(Bucket=BUCKET)
    return str(
        clients.client("emr").run_job_flow(
            Name="pipeline",
            ReleaseLabel="emr-7.5.0",
            Applications=[{"Name": "Spark"}],
            Instances={
                "MasterInstanceType": "m5.xlarge",
                "SlaveInstanceType": "m5.xlarge",
                "InstanceCount": 3,
                "KeepJobFlowAliveWhenNoSteps": True,
            },
            JobFlowRole="EMR_EC2_DefaultRole",
            ServiceRole="EMR_DefaultRole",
        )["JobFlowId"]
    )


def submit(cluster: str, *extra: str) -> int:
    return main(
        ["emr", "submit", "--cluster-id", cluster, "--code-bucket", BUCKET, *extra, str(JOB),
         "--", "--input", "s3://data/sample", "--failed-output", "s3://data/failed/run-1"]
    )


def test_submit_uploads_package_and_script_and_adds_a_spark_submit_step(
    cluster: str, clients: ClientFactory, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MESSENGER_NAMESPACE", "prod")

    assert submit(cluster) == 0

    step_id = capsys.readouterr().out.split()[1]
    step = clients.client("emr").describe_step(ClusterId=cluster, StepId=step_id)["Step"]
    assert step["Name"] == "messenger: wishlist_price_drops"
    assert step["ActionOnFailure"] == "CONTINUE"
    assert step["Config"]["Jar"] == "command-runner.jar"
    args = step["Config"]["Args"]
    assert args[:3] == ["spark-submit", "--deploy-mode", "cluster"]
    package_uri = args[args.index("--py-files") + 1]
    # The driver and executors run the node's Python 3.11, chosen explicitly (EMR: 3.9 else)
    assert "spark.pyspark.python=/usr/bin/python3.11" in args
    assert "spark.pyspark.driver.python=/usr/bin/python3.11" in args
    assert "spark.executorEnv.PYSPARK_PYTHON=/usr/bin/python3.11" in args
    assert package_uri.startswith(f"s3://{BUCKET}/emr/") and package_uri.endswith("/messenger.zip")
    prefix = package_uri.removesuffix("/messenger.zip")
    # The job's arguments come last, unchanged, after the script.
    assert args[-5:] == [
        f"{prefix}/wishlist_price_drops.py",
        "--input", "s3://data/sample", "--failed-output", "s3://data/failed/run-1",
    ]
    # Settings reach the driver as YARN application-master environment.
    assert "spark.yarn.appMasterEnv.MESSENGER_NAMESPACE=prod" in args
    assert "spark.yarn.appMasterEnv.AWS_DEFAULT_REGION=us-east-1" in args

    s3 = clients.client("s3")
    key = prefix.removeprefix(f"s3://{BUCKET}/")
    script = s3.get_object(Bucket=BUCKET, Key=f"{key}/wishlist_price_drops.py")["Body"].read()
    assert script == JOB.read_bytes()
    package = s3.get_object(Bucket=BUCKET, Key=f"{key}/messenger.zip")["Body"].read()
    names = zipfile.ZipFile(io.BytesIO(package)).namelist()
    expected = {"messenger/__init__.py", "messenger/spark.py", "messenger/produce/producer.py"}
    assert expected <= set(names)
    assert all(name.startswith("messenger/") and "__pycache__" not in name for name in names)


def test_submit_gives_the_step_the_pipelines_settings_not_the_shells(
    cluster: str, clients: ClientFactory, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a shell set up for the local endpoint: auto provisioning, no TLS-only bucket policy
    monkeypatch.setenv("MESSENGER_NAMESPACE", "prod")
    monkeypatch.setenv("MESSENGER_PROVISIONING", "auto")
    monkeypatch.setenv("MESSENGER_BUCKET_TLS_POLICY", "false")
    monkeypatch.setenv("MESSENGER_OFFLOAD_BUCKET", "prod-offload")

    assert submit(cluster) == 0
    step_id = capsys.readouterr().out.split()[1]
    args = clients.client("emr").describe_step(ClusterId=cluster, StepId=step_id)["Step"][
        "Config"]["Args"]

    # Then the step verifies channels as the pipeline does, and gets no local-only settings
    confs = [a for a in args if a.startswith("spark.")]
    for where in ("yarn.appMasterEnv", "executorEnv"):
        assert f"spark.{where}.MESSENGER_PROVISIONING=verify" in confs
        assert f"spark.{where}.MESSENGER_OFFLOAD_BUCKET=prod-offload" in confs
    assert not [a for a in confs if "BUCKET_TLS_POLICY" in a or "PROVISIONING=auto" in a]

    # And --provisioning auto / --python choose otherwise, explicitly
    assert submit(cluster, "--provisioning", "auto", "--python", "/usr/bin/python3.9") == 0
    step_id = capsys.readouterr().out.split()[1]
    args = clients.client("emr").describe_step(ClusterId=cluster, StepId=step_id)["Step"][
        "Config"]["Args"]
    assert "spark.executorEnv.MESSENGER_PROVISIONING=auto" in args
    assert "spark.pyspark.python=/usr/bin/python3.9" in args
    assert main(["emr", "submit", "--cluster-id", cluster, "--code-bucket", BUCKET,
                 "--provisioning", "off", str(JOB)]) == 2
    assert "--provisioning must be one of verify, auto" in capsys.readouterr().err


def test_same_code_goes_to_the_same_keys(cluster: str, clients: ClientFactory) -> None:
    assert submit(cluster) == 0
    assert submit(cluster, "--name", "again") == 0

    steps = clients.client("emr").list_steps(ClusterId=cluster)["Steps"]
    assert sorted(step["Name"] for step in steps) == ["again", "messenger: wishlist_price_drops"]
    packages = {a[a.index("--py-files") + 1] for a in (s["Config"]["Args"] for s in steps)}
    assert len(packages) == 1
    listed = clients.client("s3").list_objects_v2(Bucket=BUCKET)["Contents"]
    assert len(listed) == 2


def test_status_lists_steps_and_one_step(
    cluster: str, clients: ClientFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(cluster)
    submit(cluster, "--name", "second")
    first = capsys.readouterr().out.split()[1]

    assert main(["emr", "status", "--cluster-id", cluster]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert {line.split()[1] for line in lines} <= {"PENDING", "RUNNING"}

    assert main(["emr", "status", "--cluster-id", cluster, "--step-id", first]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.split()[:2] == [first, "RUNNING"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cluster-id", "cluster-1", "--code-bucket", BUCKET, str(JOB)], "--cluster-id"),
        (["--cluster-id", "j-ABC", str(JOB)], "MESSENGER_CODE_BUCKET"),
        (["--cluster-id", "j-ABC", "--code-bucket", BUCKET, "missing.py"], "script"),
        (["--cluster-id", "j-ABC", "--code-bucket", BUCKET, "--action-on-failure", "RETRY",
          str(JOB)], "CONTINUE, CANCEL_AND_WAIT, TERMINATE_CLUSTER"),
    ],
)
def test_bad_arguments_are_named(
    argv: list[str], message: str, endpoint: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MESSENGER_CODE_BUCKET", raising=False)

    assert main(["emr", "submit", *argv]) == 2

    assert message in capsys.readouterr().err


def test_package_is_importable_as_py_files(tmp_path: Path) -> None:
    # Given the zip spark-submit --py-files puts on the executors' path
    archive = tmp_path / "messenger.zip"
    archive.write_bytes(package_zip())

    # When a fresh interpreter imports the publisher with only the zip on its path first
    found = subprocess.run(
        [sys.executable, "-c", "import messenger.spark as s; print(s.__file__)"],
        env={"PYTHONPATH": str(archive)}, cwd=tmp_path, capture_output=True, text=True,
        check=True,
    ).stdout.strip()

    # Then it comes from the zip, not from the source tree
    assert found == str(archive / "messenger" / "spark.py")
