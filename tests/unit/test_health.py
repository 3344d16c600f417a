"""The health file and `check_consumer_health`: stuck states fail for real, others pass."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from messenger.consume.health import HealthFile, HealthRecord, main

NOW = 1_000_000.0


def write(path: Path, state: str, age: float, timeout: float | None) -> HealthFile:
    health = HealthFile(str(path))
    health.write(HealthRecord(state, NOW - age, timeout, 123, "app.Consumer"))
    return health


@pytest.mark.parametrize("state", ["INITIALIZING", "INITIALIZED", "PROCESSING", "EXITING"])
def test_a_limited_state_past_its_limit_is_unhealthy(tmp_path, state):
    health = write(tmp_path / "h.json", state, age=91, timeout=90)
    verdict = health.check(now=NOW)
    assert not verdict.healthy
    assert f"stuck in {state} for 91.0 s (limit 90 s)" in verdict.reason
    assert write(tmp_path / "h.json", state, age=89, timeout=90).check(now=NOW).healthy


@pytest.mark.parametrize("state", ["LISTENING", "IDLE", "EXITED"])
def test_waiting_states_have_no_limit(tmp_path, state):
    assert write(tmp_path / "h.json", state, age=86_400, timeout=None).check(now=NOW).healthy


def test_missing_file_is_healthy_while_starting(tmp_path):
    verdict = HealthFile(str(tmp_path / "absent.json")).check(now=NOW)
    assert verdict.healthy and "starting" in verdict.reason


@pytest.mark.parametrize("content", [
    "not json", "{}", '{"state": "PROCESSING", "since": "x"}',
    # Values that compare false with every limit, or never run out, must not read as healthy.
    '{"state": "PROCESSING", "since": 999000, "timeout_seconds": NaN}',
    '{"state": "PROCESSING", "since": 999000, "timeout_seconds": null}',
    '{"state": "PROCESSING", "since": NaN, "timeout_seconds": 90}',
    '{"state": "PROCESSING", "since": Infinity, "timeout_seconds": 90}',
    '{"state": "processing", "since": 999000, "timeout_seconds": 90}',
    '{"state": "STUCK", "since": 999000, "timeout_seconds": 90}',
    '{"state": "EXITING", "since": 999000, "timeout_seconds": true}',
])
def test_a_malformed_file_is_unhealthy(tmp_path, content):
    path = tmp_path / "h.json"
    path.write_text(content)
    verdict = HealthFile(str(path)).check(now=NOW)
    assert not verdict.healthy
    assert f"health file {path} is malformed" in verdict.reason  # the check's output names it


def test_a_since_in_the_future_is_unhealthy(tmp_path):
    # Given a record whose clock would only start an hour from now
    health = write(tmp_path / "h.json", "PROCESSING", age=-3600, timeout=90)
    # Then it is not read as "within its limit"
    verdict = health.check(now=NOW)
    assert not verdict.healthy and "ahead" in verdict.reason
    # A small clock step is tolerated
    assert write(tmp_path / "h.json", "PROCESSING", age=-1, timeout=90).check(now=NOW).healthy


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    health = write(tmp_path / "h.json", "PROCESSING", age=0, timeout=90)
    record = health.read()
    assert record == HealthRecord("PROCESSING", NOW, 90.0, 123, "app.Consumer")
    assert json.loads((tmp_path / "h.json").read_text())["pid"] == 123
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.json", "h.json.lock"]


def test_main_exit_codes(tmp_path, capsys):
    path = tmp_path / "h.json"
    write(path, "PROCESSING", age=NOW, timeout=90)  # since the epoch: stuck
    assert main(["--file", str(path)]) == 1
    assert capsys.readouterr().out.startswith("unhealthy: app.Consumer stuck in PROCESSING")
    write(path, "IDLE", age=NOW, timeout=None)
    assert main(["--file", str(path)]) == 0
    assert main(["--file", str(tmp_path / "missing.json")]) == 0


def test_console_script_reads_the_file_named_by_the_environment(tmp_path):
    # The HEALTHCHECK runs `check_consumer_health` with no arguments.
    script = shutil.which("check_consumer_health", path=os.path.dirname(sys.executable))
    command = [script] if script else [sys.executable, "-m", "messenger.consume.health"]
    path = tmp_path / "h.json"
    write(path, "EXITING", age=NOW, timeout=45)
    env = {**os.environ, "MESSENGER_HEALTH_FILE": str(path)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "stuck in EXITING" in result.stdout
