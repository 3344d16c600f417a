"""The run-a-job state machine and its cluster, as synthesized: what keeps a real cluster from
outliving its job, and the Python its steps run."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from messenger.emr_step import EMR_PYTHON
from stacks.emr_pipeline import (
    CREATE_CLUSTER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_JOB_TIMEOUT,
    EMR_BOTO3,
    TERMINATE_TIMEOUT,
)
from tests.emr_env import EMR_PYTHON as LOCAL_EMR_PYTHON
from tests.emr_env import ROOT, emr_python
from tests.infra.conftest import CloudAssembly

TASKS = ("CreateCluster", "RunJob", "TerminateCluster", "TerminateAfterFailure")


@pytest.fixture(scope="module")
def machine(assembly: CloudAssembly) -> dict[str, Any]:
    (resource,) = assembly.resources("AWS::StepFunctions::StateMachine", "pipeline").values()
    parts = resource["Properties"]["DefinitionString"]["Fn::Join"][1]
    definition = json.loads("".join(p if isinstance(p, str) else "TOKEN" for p in parts))
    return {"definition": definition, "states": definition["States"]}


def test_every_task_has_its_own_timeout_within_the_executions(machine: dict[str, Any]) -> None:
    states = machine["states"]
    timeouts = {name: states[name]["TimeoutSeconds"] for name in TASKS}
    assert timeouts == {
        "CreateCluster": CREATE_CLUSTER_TIMEOUT.to_seconds(),
        "RunJob": DEFAULT_JOB_TIMEOUT.to_seconds(),
        "TerminateCluster": TERMINATE_TIMEOUT.to_seconds(),
        "TerminateAfterFailure": TERMINATE_TIMEOUT.to_seconds(),
    }
    # The longest path (create, run, terminate) times out before the execution does, so the
    # Catch that terminates the cluster always gets to run
    longest = timeouts["CreateCluster"] + timeouts["RunJob"] + timeouts["TerminateCluster"]
    assert machine["definition"]["TimeoutSeconds"] > longest


def test_every_task_retries_emr_throttling_with_backoff(machine: dict[str, Any]) -> None:
    for name in TASKS:
        (retry,) = machine["states"][name]["Retry"]
        assert "EMR.AmazonElasticMapReduceException" in retry["ErrorEquals"], name
        assert "EMR.ThrottlingException" in retry["ErrorEquals"], name
        assert "States.ALL" not in retry["ErrorEquals"] and "States.Timeout" not in retry[
            "ErrorEquals"], name
        assert retry["BackoffRate"] >= 2 and 2 <= retry["MaxAttempts"] <= 6, name


def test_every_task_is_caught_and_a_created_cluster_is_terminated(
    machine: dict[str, Any],
) -> None:
    states = machine["states"]
    for name in TASKS:
        (catch,) = states[name]["Catch"]
        assert catch["ErrorEquals"] == ["States.ALL"], name
    # A failed or timed-out step: terminate, then fail with the step's error and cause
    run_catch = states["RunJob"]["Catch"][0]
    assert states[run_catch["Next"]]["Resource"].endswith("terminateCluster.sync")
    assert "'error': $states.errorOutput" in run_catch["Output"]
    after = states[run_catch["Next"]]
    assert after["Next"] == after["Catch"][0]["Next"] == "JobFailed"
    assert after["Catch"][0]["ResultPath"] is None  # the job's error stays the cause
    # Every failure state names the error and carries its cause
    for fail in ("JobFailed", "ClusterFailed", "TerminateFailed"):
        assert states[fail]["Type"] == "Fail"
        assert (states[fail]["ErrorPath"], states[fail]["CausePath"]) == (
            "$.error.Error", "$.error.Cause"), fail
    assert states["CreateCluster"]["Catch"][0]["Next"] == "ClusterFailed"
    assert states["TerminateCluster"]["Catch"][0]["Next"] == "TerminateFailed"
    for name in ("CreateCluster", "TerminateCluster"):
        assert states[name]["Catch"][0]["ResultPath"] == "$.error"


def test_the_cluster_ends_itself_when_nothing_terminates_it(machine: dict[str, Any]) -> None:
    cluster = machine["states"]["CreateCluster"]["Parameters"]
    # Stopped execution, failed terminate: the idle policy ends the cluster
    assert cluster["AutoTerminationPolicy"] == {"IdleTimeout": DEFAULT_IDLE_TIMEOUT.to_seconds()}
    assert 60 <= DEFAULT_IDLE_TIMEOUT.to_seconds() <= 3600
    assert cluster["Instances"]["TerminationProtected"] is False
    # A failed step terminates its cluster itself
    step = machine["states"]["RunJob"]["Arguments"]["Step"]
    assert step["ActionOnFailure"] == "TERMINATE_CLUSTER"


def test_steps_run_python_3_11_chosen_in_cluster_and_step(machine: dict[str, Any]) -> None:
    states = machine["states"]
    configurations = {
        c["Classification"]: c for c in states["CreateCluster"]["Parameters"]["Configurations"]
    }
    (export,) = configurations["spark-env"]["Configurations"]
    assert export["Classification"] == "export"
    assert export["Properties"] == {"PYSPARK_PYTHON": EMR_PYTHON,
                                    "PYSPARK_DRIVER_PYTHON": EMR_PYTHON}
    assert configurations["spark-defaults"]["Properties"] == {
        "spark.pyspark.python": EMR_PYTHON, "spark.pyspark.driver.python": EMR_PYTHON,
    }
    submit = states["SparkSubmit"]["Result"]
    for conf in ("spark.pyspark.python", "spark.pyspark.driver.python",
                 "spark.yarn.appMasterEnv.PYSPARK_PYTHON", "spark.executorEnv.PYSPARK_PYTHON"):
        assert f"{conf}={EMR_PYTHON}" in submit, conf
    # Each confs comes as a `--conf` argument before the library and the script
    assert submit.index("--py-files") > submit.index(f"spark.pyspark.python={EMR_PYTHON}") - 1
    assert EMR_PYTHON == "/usr/bin/python3.11"
    # A bootstrap action makes sure that interpreter imports boto3
    (bootstrap,) = states["CreateCluster"]["Parameters"]["BootstrapActions"]
    assert bootstrap["ScriptBootstrapAction"]["Args"] == [EMR_PYTHON, EMR_BOTO3]


def test_the_bootstrap_pin_is_the_tested_one() -> None:
    pins = (ROOT / "requirements-emr.txt").read_text().splitlines()
    assert f'{EMR_BOTO3}; python_version >= "3.10"' in pins


def test_the_bootstrap_action_leaves_a_ready_interpreter_alone() -> None:
    # Given an interpreter that already imports boto3 (no dnf, no pip on this machine)
    python = emr_python(LOCAL_EMR_PYTHON)
    done = subprocess.run(
        ["bash", str(ROOT / "stacks" / "emr_python.sh"), str(python), EMR_BOTO3],
        capture_output=True, text=True, timeout=60,
    )
    # Then it only reports the versions
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("step python 3.11") and "boto3 1.44.5" in done.stdout


def test_the_job_role_may_read_the_bootstrap_script(
    assembly: CloudAssembly, machine: dict[str, Any]
) -> None:
    # The nodes (the job role's instance profile) download the bootstrap script themselves
    (bootstrap,) = machine["states"]["CreateCluster"]["Parameters"]["BootstrapActions"]
    path = bootstrap["ScriptBootstrapAction"]["Path"]
    assert path.startswith("s3://") and path.endswith(".sh")
    bucket, key = path.removeprefix("s3://").split("/", 1)
    readable = [
        resource
        for policy in assembly.resources("AWS::IAM::Policy", "pipeline").values()
        if "EmrJobRole" in json.dumps(policy["Properties"]["Roles"])
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if statement["Action"] == "s3:GetObject"
        for resource in statement["Resource"]
    ]
    assert f"arn:aws:s3:::{bucket}/{key}" in readable
