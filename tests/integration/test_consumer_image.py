"""The image's entrypoint as a plain process (no Docker engine here): it execs
`messenger consume`, so the consumer itself is PID 1 of the container and gets SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from messenger import Settings

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = str(ROOT / "consumer_image" / "entrypoint.sh")


def image_env(settings: Settings, tmp_path: Path) -> dict[str, str]:
    bin_dir = os.path.dirname(sys.executable)  # where `messenger` is installed
    return {
        **os.environ, **settings.as_env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "MESSENGER_HEALTH_FILE": str(tmp_path / "health.json"),
        "CONSUMER_TEST_RECORD": str(tmp_path / "record.jsonl"),
    }


@pytest.mark.timeout(60)
def test_entrypoint_execs_the_consumer_which_exits_0_on_sigterm(settings, tmp_path):
    log = tmp_path / "consumer.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            ["sh", ENTRYPOINT, "tests.integration.consumer_apps.apps:SleepyConsumer"],
            env=image_env(settings, tmp_path), stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
        )
        try:
            health = tmp_path / "health.json"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if health.exists() and json.loads(health.read_text())["state"] == "LISTENING":
                    break
                assert process.poll() is None, log.read_text()
                time.sleep(0.05)
            # exec: the shell is gone, the consumer has its pid
            assert json.loads(health.read_text())["pid"] == process.pid
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=15) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
    states = [json.loads(line).get("state") for line in log.read_text().splitlines()
              if line.startswith("{") and '"event": "state"' in line]
    assert states[-2:] == ["EXITING", "EXITED"]


def test_entrypoint_passes_a_whole_messenger_command_through(settings, tmp_path):
    # An ECS task definition may give `messenger consume <class>` as its command.
    result = subprocess.run(
        ["sh", ENTRYPOINT, "messenger", "consume", "--help"],
        env=image_env(settings, tmp_path), capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "package.module:ClassName" in result.stdout
