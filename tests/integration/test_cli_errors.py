"""Every `messenger` command fails with one line and an exit code, never a botocore traceback,
and without library INFO noise, when AWS cannot be reached."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from messenger.tools.runtime import COMMAND_RETRY_BUDGET_SECONDS

#: Nothing listens on port 9 of loopback: every connection is refused.
DEAD_ENDPOINT = "http://127.0.0.1:9"
#: Seconds a Python process takes to start and import the command, on a slow runner.
STARTUP_SECONDS = 5.0

COMMANDS = [
    ["top", "--once"],
    ["status", "0123456789abcdef"],
    ["requeue", "orders-dlq", "orders"],
    ["dlq", "list", "orders"],
    ["dlq", "requeue", "orders", "job-1"],
    ["workers"],
    ["emr", "status", "--cluster-id", "j-ABCDEFGHIJKL"],
    ["emr", "submit", "--cluster-id", "j-ABCDEFGHIJKL", "--code-bucket", "missing-bucket",
     "spark_jobs/wishlist_price_drops.py"],
]


def _run(command: list[str], endpoint: str,
         budget: str | None) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    if budget is not None:
        env["MESSENGER_RETRY_BUDGET"] = budget
    return subprocess.run(
        [sys.executable, "-m", "messenger", *command], env=env, capture_output=True, text=True,
        timeout=120,
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("messenger: "), result.stderr
    assert "Traceback" not in result.stderr
    assert "Found credentials" not in result.stderr + result.stdout
    return lines[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_dead_endpoint_gives_one_line_and_an_exit_code(command: list[str]) -> None:
    # Given a dead endpoint, and a short MESSENGER_RETRY_BUDGET (this test is about the line)
    started = time.monotonic()
    result = _run(command, DEAD_ENDPOINT, budget="0.5")
    # Then the command says so in one line naming the endpoint, and exits non-zero, within the
    # budget it was given (a command's every call honours it)
    line = _one_line(result)
    assert result.returncode in (2, 3), result.stderr
    assert DEAD_ENDPOINT in line
    assert time.monotonic() - started < 0.5 + STARTUP_SECONDS


@pytest.mark.timeout(60)
def test_a_dead_endpoint_ends_a_command_within_its_default_budget() -> None:
    # Given a dead endpoint and no MESSENGER_RETRY_BUDGET
    started = time.monotonic()
    result = _run(["workers"], DEAD_ENDPOINT, budget=None)
    elapsed = time.monotonic() - started
    # Then the command gives up within the command's default budget (not the library's 20 s),
    # says what happened and how to wait longer, and exits 3 (AWS not reached)
    line = _one_line(result)
    assert result.returncode == 3, result.stderr
    assert line.startswith(f'messenger: AWS error: Could not connect to the endpoint URL: '
                           f'"{DEAD_ENDPOINT}/"'), line
    assert line.endswith(f"(gave up within the {COMMAND_RETRY_BUDGET_SECONDS:g} s retry budget; "
                         f"set MESSENGER_RETRY_BUDGET to wait longer)"), line
    assert elapsed < COMMAND_RETRY_BUDGET_SECONDS + STARTUP_SECONDS


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
