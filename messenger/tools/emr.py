"""`messenger emr`: run a PySpark job of `spark_jobs/` as an EMR step, and show step states.

    messenger emr submit --cluster-id j-ABC --code-bucket B spark_jobs/wishlist_price_drops.py \
        -- --input s3://data/wishlist --failed-output s3://data/failed/run-1
    messenger emr status --cluster-id j-ABC [--step-id s-XYZ]
    messenger emr run price-drops-2026-11-21 [--json]

`run` shows what the publishing run of a run key did (`messenger.spark.publish(run_key=...)`):
its partitions finished, the rows published and skipped (sent by an earlier attempt), from the
run's ledger in the dedup table (`messenger.jobs.runs`); exit 1 when no such run is recorded,
3 when some partition has not finished.

`submit` zips the `messenger` package (messenger.zip), uploads it and the script to
`s3://<code bucket>/emr/<content hash>/` (the same code gives the same keys), and adds a
command-runner.jar step: `spark-submit --deploy-mode cluster --py-files <zip> <script> <args>`.
The step gets the pipeline's settings (`step_env`): the submitting shell's namespace, region,
offload bucket, KMS key and limits, but provisioning `verify` (`--provisioning auto` to change it)
and nothing that only suits the shell (e.g. the local endpoint's MESSENGER_BUCKET_TLS_POLICY).
They reach the driver as `spark.yarn.appMasterEnv.*` and the executors as `spark.executorEnv.*`;
the driver also ships them to the executors itself (messenger.spark). The driver and executors
run `--python` (default EMR_PYTHON, Python 3.11).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from messenger.aws import ClientFactory
from messenger.emr_step import (  # the step's facts, shared with the stacks
    CODE_PREFIX,
    EMR_PYTHON,
    PACKAGE_ZIP,
    package_zip,
    python_confs,
)
from messenger.errors import InvalidSettings
from messenger.jobs.runs import RunLedger, RunSummary
from messenger.settings import Settings
from messenger.tools.runtime import CommandRuntime

CODE_BUCKET_ENV = "MESSENGER_CODE_BUCKET"
ACTIONS_ON_FAILURE = ("CONTINUE", "CANCEL_AND_WAIT", "TERMINATE_CLUSTER")
PROVISIONING_MODES = ("verify", "auto")
#: What of `Settings.as_env()` a step gets (the pipeline's stack sets the same ones).
STEP_SETTINGS = ("MESSENGER_NAMESPACE", "MESSENGER_OFFLOAD_BUCKET", "MESSENGER_OFFLOAD_THRESHOLD",
                 "MESSENGER_KMS_KEY", "MESSENGER_RETRY_BUDGET", "AWS_DEFAULT_REGION")
CLUSTER_ID = re.compile(r"^j-[A-Z0-9]{1,255}$")
FAILED_STATES = frozenset({"FAILED", "CANCELLED", "INTERRUPTED"})
STEP_ID = re.compile(r"^s-[A-Z0-9]{1,255}$")


@dataclass(frozen=True)
class SubmittedStep:
    step_id: str
    package_uri: str
    script_uri: str
    args: list[str]


@dataclass(frozen=True)
class StepState:
    step_id: str
    name: str
    state: str
    reason: str


def step_env(settings: Settings, provisioning: str = "verify") -> dict[str, str]:
    """The settings a step gets: `STEP_SETTINGS` of `settings` (empty ones left out) and
    `provisioning` (default verify, as the pipeline: the stacks own the channels)."""
    if provisioning not in PROVISIONING_MODES:
        raise InvalidSettings(
            f"--provisioning must be one of {', '.join(PROVISIONING_MODES)}, got {provisioning!r}"
        )
    env = {name: value for name, value in settings.as_env().items()
           if name in STEP_SETTINGS and value}
    return {**env, "MESSENGER_PROVISIONING": provisioning}


def spark_submit_args(
    package_uri: str, script_uri: str, job_args: Sequence[str], env: Mapping[str, str],
    python: str = EMR_PYTHON,
) -> list[str]:
    """The command-runner.jar arguments of the step."""
    args = ["spark-submit", "--deploy-mode", "cluster", *python_confs(python),
            "--py-files", package_uri]
    for name, value in sorted(env.items()):
        args += ["--conf", f"spark.yarn.appMasterEnv.{name}={value}",
                 "--conf", f"spark.executorEnv.{name}={value}"]
    return [*args, script_uri, *job_args]


def submit(
    clients: ClientFactory,
    cluster_id: str,
    script: Path,
    job_args: Sequence[str],
    code_bucket: str,
    settings: Settings,
    name: str | None = None,
    action_on_failure: str = "CONTINUE",
    provisioning: str = "verify",
    python: str = EMR_PYTHON,
) -> SubmittedStep:
    """Upload the package and `script`, add the spark-submit step; returns its id and URIs.

    provisioning: the step's MESSENGER_PROVISIONING (verify, as the pipeline; or auto).
    python: the interpreter of the driver and executors on the nodes (default Python 3.11)."""
    _check(cluster_id, script, code_bucket, action_on_failure)
    env = step_env(settings, provisioning)
    package = package_zip()
    source = script.read_bytes()
    digest = hashlib.sha256(package + b"\0" + source).hexdigest()[:16]
    prefix = f"{CODE_PREFIX}/{digest}"
    s3 = clients.client("s3")
    s3.put_object(Bucket=code_bucket, Key=f"{prefix}/{PACKAGE_ZIP}", Body=package)
    s3.put_object(Bucket=code_bucket, Key=f"{prefix}/{script.name}", Body=source)
    package_uri = f"s3://{code_bucket}/{prefix}/{PACKAGE_ZIP}"
    script_uri = f"s3://{code_bucket}/{prefix}/{script.name}"
    args = spark_submit_args(package_uri, script_uri, job_args, env, python)
    response = clients.client("emr").add_job_flow_steps(
        JobFlowId=cluster_id,
        Steps=[
            {
                "Name": name or f"messenger: {script.stem}",
                "ActionOnFailure": action_on_failure,
                "HadoopJarStep": {"Jar": "command-runner.jar", "Args": args},
            }
        ],
    )
    return SubmittedStep(response["StepIds"][0], package_uri, script_uri, args)


def step_states(
    clients: ClientFactory, cluster_id: str, step_id: str | None = None
) -> list[StepState]:
    """The cluster's steps, newest first (or only `step_id`)."""
    if not CLUSTER_ID.match(cluster_id):
        raise InvalidSettings(f"--cluster-id must look like j-XXXXXXXX, got {cluster_id!r}")
    emr = clients.client("emr")
    if step_id is not None:
        if not STEP_ID.match(step_id):
            raise InvalidSettings(f"--step-id must look like s-XXXXXXXX, got {step_id!r}")
        steps = [emr.describe_step(ClusterId=cluster_id, StepId=step_id)["Step"]]
    else:
        steps = [
            step
            for page in emr.get_paginator("list_steps").paginate(ClusterId=cluster_id)
            for step in page["Steps"]
        ]
    return [_state(step) for step in steps]


def _state(step: Mapping[str, Any]) -> StepState:
    status = step.get("Status", {})
    failure = status.get("FailureDetails") or {}
    reason = failure.get("Reason") or failure.get("Message") or ""
    if not reason:
        reason = (status.get("StateChangeReason") or {}).get("Message", "")
    return StepState(step["Id"], step.get("Name", ""), status.get("State", "UNKNOWN"), reason)


def _check(cluster_id: str, script: Path, code_bucket: str, action_on_failure: str) -> None:
    if not CLUSTER_ID.match(cluster_id):
        raise InvalidSettings(f"--cluster-id must look like j-XXXXXXXX, got {cluster_id!r}")
    if not code_bucket:
        raise InvalidSettings(
            f"no code bucket: pass --code-bucket or set {CODE_BUCKET_ENV} (the pipeline stack's "
            f"CodeBucketName output)"
        )
    if script.suffix != ".py" or not script.is_file():
        raise InvalidSettings(f"script must be an existing .py file, got {str(script)!r}")
    if action_on_failure not in ACTIONS_ON_FAILURE:
        raise InvalidSettings(
            f"--action-on-failure must be one of {', '.join(ACTIONS_ON_FAILURE)}, "
            f"got {action_on_failure!r}"
        )


#: `messenger emr run`'s exit code when the run has partitions no attempt finished.
UNFINISHED_EXIT = 3


def describe_run(summary: RunSummary) -> list[str]:
    """The lines `messenger emr run` prints."""
    created = datetime.datetime.fromtimestamp(summary.created_at, datetime.timezone.utc)
    counts = summary.counts
    lines = [
        f"run {summary.run_key}  channel {summary.channel}  since "
        f"{created:%Y-%m-%d %H:%M:%S} UTC",
        f"  partitions  {summary.finished}/{summary.partitions} finished"
        f"  ({summary.attempts} attempt(s) ran to the end)",
        f"  published   {counts['published']}  (by the attempts that finished them)",
        f"  skipped     {counts['skipped']}  (sent by an earlier attempt)",
    ]
    if counts.get("duplicates"):
        lines.append(f"  duplicates  {counts['duplicates']}  (rows repeating another's key)")
    if summary.last_attempt:
        last = summary.last_attempt
        lines.append(f"  last attempt: published {last.get('published', 0)}, skipped "
                     f"{last.get('skipped', 0)}, failed {last.get('failed', 0)}")
    if summary.finished < summary.partitions:
        lines.append(f"  {summary.partitions - summary.finished} partition(s) not finished: "
                     f"re-run the step with the same run key")
    return lines


def run_cli(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """Run `messenger emr submit|status|run`; prints the step id, the step states or a run."""
    env = os.environ if environ is None else environ
    # the step gets the shell's settings as they are; the command's own calls, its budget
    settings = Settings.from_env(env)
    clients = CommandRuntime.from_env(env).clients
    if args.emr_command == "run":
        summary = RunLedger(clients, settings, args.run_key).summary()
        if summary is None:
            print(f"no run {args.run_key!r} recorded (never published with this run key, or "
                  f"its window is over)")
            return 1
        if getattr(args, "json", False):
            print(json.dumps(summary.as_dict()))
        else:
            print("\n".join(describe_run(summary)))
        return UNFINISHED_EXIT if summary.finished < summary.partitions else 0
    if args.emr_command == "submit":
        job_args = list(args.job_args)
        if job_args[:1] == ["--"]:
            job_args = job_args[1:]
        step = submit(
            clients, args.cluster_id, Path(args.script), job_args,
            args.code_bucket or env.get(CODE_BUCKET_ENV, ""), settings,
            name=args.name, action_on_failure=args.action_on_failure,
            provisioning=getattr(args, "provisioning", "verify"),
            python=getattr(args, "python", EMR_PYTHON),
        )
        print(f"step {step.step_id} added to {args.cluster_id}")
        print(f"  package {step.package_uri}")
        print(f"  script  {step.script_uri}")
        return 0
    states = step_states(clients, args.cluster_id, args.step_id)
    if not states:
        print(f"no steps on {args.cluster_id}")
    for state in states:
        line = f"{state.step_id}  {state.state:<14} {state.name}"
        print(f"{line}  ({state.reason})" if state.reason else line)
    # One step asked for: the exit code tells scripts whether it went wrong.
    if args.step_id is not None and states[0].state in FAILED_STATES:
        return 1
    return 0
