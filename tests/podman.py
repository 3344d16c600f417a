"""The local podman engine of consumer_image/build_local.sh, for tests that build and run the
consumer image as ECS would (tests/integration/test_consumer_container.py).

`local_engine()` returns the engine, or the one-line reason it cannot be used here; `build_image`
builds the image once (podman's layer cache keeps a rebuild of unchanged code at a few seconds).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / "consumer_image" / "build_local.sh"
#: Set in CI (.ci/run): a missing engine fails the run instead of skipping the tests.
REQUIRE_VARIABLE = "MESSENGER_REQUIRE_PODMAN"
CANNOT_SET_UP = 3  # build_local.sh's exit code when the engine cannot be set up here


class EngineUnavailable(Exception):
    """No podman engine here; the message is the one line saying why."""


@dataclass
class Engine:
    """podman with build_local.sh's storage and containers.conf."""

    command: list[str]
    env: dict[str, str]

    def run(
        self, *args: str, check: bool = True, timeout: float = 60, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self.command, *args], env=self.env, capture_output=True, text=True,
            timeout=timeout, input=input,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
            )
        return result

    def inspect(self, name: str) -> dict[str, Any]:
        [data] = json.loads(self.run("inspect", name).stdout)
        return dict(data)


def engine_problem() -> str | None:
    """Why build_local.sh cannot run podman here (cheap checks only), or None."""
    if not sys.platform.startswith("linux"):
        return "podman runs containers on Linux only"
    missing = [name for name in ("podman", "runc", "debootstrap") if shutil.which(name) is None]
    if missing:
        return (f"{', '.join(missing)} not installed: `make consumer-image-engine` sets the "
                f"engine up (root, Debian)")
    if os.geteuid() != 0:
        return "build_local.sh runs podman as root with its own storage; this is not root"
    return None


def local_engine() -> Engine:
    """The engine build_local.sh sets up; raises EngineUnavailable with the reason."""
    problem = engine_problem()
    if problem is not None:
        raise EngineUnavailable(problem)
    printed = subprocess.run(
        [str(BUILD_SCRIPT), "--print-env"], capture_output=True, text=True, check=True
    ).stdout
    exports = [shlex.split(line)[1] for line in printed.splitlines() if line.startswith("export ")]
    values = dict(assignment.split("=", 1) for assignment in exports)
    env = {**os.environ, "CONTAINERS_CONF": values["CONTAINERS_CONF"]}
    return Engine(command=shlex.split(values["PODMAN"]), env=env)


def build_image(app_dir: Path, tag: str, log: Path) -> None:
    """Build the consumer image of `app_dir` as `tag` (sets up the base images when missing)."""
    with open(log, "w") as out:
        result = subprocess.run(
            [str(BUILD_SCRIPT), "--no-install", "--app-dir", str(app_dir), "--tag", tag],
            stdout=out, stderr=subprocess.STDOUT, timeout=900,
        )
    if result.returncode == CANNOT_SET_UP:
        lines = log.read_text().strip().splitlines()
        raise EngineUnavailable(lines[-1] if lines else "build_local.sh could not set up podman")
    if result.returncode != 0:
        raise AssertionError(f"the consumer image failed to build:\n{log.read_text()[-4000:]}")


@dataclass(frozen=True)
class HealthCheck:
    """One `podman healthcheck run`: its exit code and verdict, and what the check printed."""

    exit_code: int
    verdict: str  # podman 4.3 prints "unhealthy" on a failure, nothing on success
    check_exit_code: int
    check_output: str
    status: str  # "starting" within the start period, then "healthy" / "unhealthy"


@dataclass
class Container:
    """One detached container of the consumer image, its JSON log read through `podman logs`."""

    engine: Engine
    name: str = field(default_factory=lambda: f"messenger-test-{uuid.uuid4().hex[:10]}")

    def start(self, image: str, args: Sequence[str], env: dict[str, str],
              volumes: Sequence[str] = ()) -> Container:
        options = [f"--env={key}={value}" for key, value in env.items()]
        options += [f"--volume={volume}" for volume in volumes]
        # --network host: the moto server listens on the host's loopback.
        self.engine.run("run", "--detach", "--name", self.name, "--network", "host",
                        *options, image, *args)
        return self

    def logs(self) -> str:
        result = self.engine.run("logs", self.name, check=False)
        return result.stdout + result.stderr

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.logs().splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue  # a line podman split mid-write
        return found

    def running(self) -> bool:
        return bool(self.engine.inspect(self.name)["State"]["Running"])

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], what: str,
                 timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if predicate(event):
                    return event
            if not self.running():
                break
            time.sleep(0.2)
        raise AssertionError(f"no {what} from the container; its log:\n{self.logs()[-3000:]}")

    def wait_for_state(self, state: str, timeout: float = 30.0) -> dict[str, Any]:
        return self.wait_for(
            lambda e: e.get("event") == "state" and e.get("state") == state, state, timeout
        )

    def wait_for_event(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        return self.wait_for(lambda e: e.get("event") == name, name, timeout)

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return self.engine.run("exec", self.name, *command, check=False)

    def health_check(self) -> HealthCheck:
        """What ECS does on each interval: the image's HEALTHCHECK command, once."""
        run = self.engine.run("healthcheck", "run", self.name, check=False)
        health = self.engine.inspect(self.name)["State"]["Health"]
        last = health["Log"][-1]
        return HealthCheck(run.returncode, run.stdout.strip(), last["ExitCode"], last["Output"],
                           health["Status"])

    def remove(self) -> None:
        self.engine.run("rm", "--force", "--time", "0", self.name, check=False)
