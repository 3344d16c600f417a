"""Every `messenger` command fails with one line and an exit code, never a botocore traceback,
and without library INFO noise, when AWS cannot be reached."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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


def _run(command: list[str], endpoint: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "MESSENGER_RETRY_BUDGET": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "messenger", *command], env=env, capture_output=True, text=True,
        timeout=120,
    )


@pytest.mark.timeout(150)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_dead_endpoint_gives_one_line_and_an_exit_code(command: list[str]) -> None:
    # Given nothing listening on port 9 of loopback (every connection refused)
    result = _run(command, "http://127.0.0.1:9")
    # Then the command says so in one line and exits non-zero
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode in (2, 3), result.stderr
    assert len(lines) == 1 and lines[0].startswith("messenger: "), result.stderr
    assert "Traceback" not in result.stderr
    assert "Found credentials" not in result.stderr + result.stdout


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
