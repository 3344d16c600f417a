"""Every `messenger` command fails with one line and an exit code, never a botocore traceback,
and without library INFO noise, when AWS cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from messenger.tools.runtime import COMMAND_RETRY_BUDGET_SECONDS
from tests.integration.timed_command import LOG_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
#: Nothing listens on port 9 of loopback: every connection is refused.
DEAD_ENDPOINT = "http://127.0.0.1:9"
#: How much later than its deadline a command may still make its last attempt or exit: a retry
#: sleeps until the deadline at the latest, and on a machine whose every core is busy the
#: process gets a core back that much later. Far below the gap between the budgets told apart
#: (0.5 s given, 5 s the command's default, 20 s the library's).
LATE_WAKEUP_SECONDS = 2.0

COMMANDS = [
    ["top", "--once"],
    ["status", "0123456789abcdef"],
    ["requeue", "orders-dlq", "orders"],
    ["dlq", "list", "orders"],
    ["dlq", "requeue", "orders", "job-1"],
    ["workers"],
    ["limits", "show", "orders"],
    ["limits", "set", "orders", "--rate", "10/s"],
    ["emr", "status", "--cluster-id", "j-ABCDEFGHIJKL"],
    ["emr", "submit", "--cluster-id", "j-ABCDEFGHIJKL", "--code-bucket", "missing-bucket",
     "spark_jobs/wishlist_price_drops.py"],
]


def _run(command: list[str], endpoint: str, budget: str | None,
         timings: Path) -> subprocess.CompletedProcess[str]:
    """The command as `python -m messenger` runs it, its AWS calls timed into `timings`
    (tests.integration.timed_command)."""
    env = {
        "PATH": os.environ["PATH"],
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        LOG_VARIABLE: str(timings),
    }
    if budget is not None:
        env["MESSENGER_RETRY_BUDGET"] = budget
    return subprocess.run(
        [sys.executable, "-m", "tests.integration.timed_command", *command], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120,
    )


def _within_budget(timings: Path, budget: float) -> dict[str, Any]:
    """Check, on the command's own clock, that it held its AWS calls to `budget`: every client
    factory it made has that budget, each thread's attempts were all sent within it of the
    thread's first call, and the command ended within it of its first call. Measured from the
    command's first call, not from the interpreter's start: starting Python and importing
    botocore takes seconds on a busy machine, and no budget covers them."""
    timed = json.loads(timings.read_text())
    assert timed["budgets"] and set(timed["budgets"]) == {budget}, timed["budgets"]
    assert timed["calls"], "the command made no AWS call"
    first = min(calls[0][0] for calls in timed["calls"].values())
    for thread, calls in timed["calls"].items():
        started = calls[0][0]
        attempts = [sent for _, sent_at in calls for sent in sent_at]
        assert attempts, f"{thread}: no attempt sent"
        late = max(attempts) - started
        assert late <= budget + LATE_WAKEUP_SECONDS, \
            f"{thread}: an attempt {late:.2f} s after its first call, budget {budget:g} s"
    ended = timed["ended"] - first
    assert ended <= budget + LATE_WAKEUP_SECONDS, \
        f"ended {ended:.2f} s after its first call, budget {budget:g} s"
    return timed


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("messenger: "), result.stderr
    assert "Traceback" not in result.stderr
    assert "Found credentials" not in result.stderr + result.stdout
    return lines[0]


@pytest.mark.timeout(180)  # a hang; the budgets are checked on the command's clock
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_dead_endpoint_gives_one_line_and_an_exit_code(command: list[str],
                                                        tmp_path: Path) -> None:
    # Given a dead endpoint, and a short MESSENGER_RETRY_BUDGET (this test is about the line)
    result = _run(command, DEAD_ENDPOINT, budget="0.5", timings=tmp_path / "timings.json")
    # Then the command says so in one line naming the endpoint, and exits non-zero, within the
    # budget it was given (a command's every call honours it), counted from its first call
    line = _one_line(result)
    assert result.returncode in (2, 3), result.stderr
    assert DEAD_ENDPOINT in line
    _within_budget(tmp_path / "timings.json", 0.5)


@pytest.mark.timeout(180)  # a hang; the budgets are checked on the command's clock
def test_a_dead_endpoint_ends_a_command_within_its_default_budget(tmp_path: Path) -> None:
    # Given a dead endpoint and no MESSENGER_RETRY_BUDGET
    result = _run(["workers"], DEAD_ENDPOINT, budget=None, timings=tmp_path / "timings.json")
    # Then the command gives up within the command's default budget (not the library's 20 s),
    # says what happened and how to wait longer, and exits 3 (AWS not reached)
    line = _one_line(result)
    assert result.returncode == 3, result.stderr
    assert line.startswith(f'messenger: AWS error: Could not connect to the endpoint URL: '
                           f'"{DEAD_ENDPOINT}/"'), line
    assert line.endswith(f"(gave up within the {COMMAND_RETRY_BUDGET_SECONDS:g} s retry budget; "
                         f"set MESSENGER_RETRY_BUDGET to wait longer)"), line
    # within that budget (not the library's 20 s) on the command's own clock, from its first
    # call, and its clients retried within it, not only once (each attempt is refused at once)
    timed = _within_budget(tmp_path / "timings.json", COMMAND_RETRY_BUDGET_SECONDS)
    assert sum(len(sent) for calls in timed["calls"].values() for _, sent in calls) > 1


@pytest.mark.parametrize("target,env,expected", [
    # a module that raises on import: the module, the exception and where, not a traceback
    ("tests.integration.consumer_apps.broken:ZeroConcurrency", {"BROKEN_CONSUMER_RAISES": "1"},
     ["cannot import 'tests.integration.consumer_apps.broken'",
      "RuntimeError: DATABASE_URL is not set", "broken.py:"]),
    # a class that does not exist: says so, and lists what the module has
    ("tests.integration.consumer_apps.broken:ZeroConcurency", {},
     ["has no 'ZeroConcurency'", "ZeroConcurrency"]),
    # concurrency = 0 on the class: the class attribute, not the environment variable
    ("tests.integration.consumer_apps.broken:ZeroConcurrency", {},
     ["ZeroConcurrency.concurrency must be a whole number >= 1", "got 0"]),
    ("os:path", {}, ["'os:path' is a module, not a Consumer subclass"]),
], ids=["import-error", "missing-class", "class-concurrency", "not-a-class"])
def test_a_bad_consumer_target_gives_one_line_and_exit_2(target, env, expected) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "messenger", "consume", target],
        env={**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", **env},
        capture_output=True, text=True, timeout=60,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("messenger: "), result.stderr
    for text in expected:
        assert text in lines[0]
    assert "MESSENGER_CONCURRENCY)" not in lines[0]
