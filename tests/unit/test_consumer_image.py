"""The consumer image's Dockerfile: no Docker engine here, so its key lines are checked as text
(the entrypoint runs as a plain process in tests/integration/test_consumer_image.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "consumer_image" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def test_slim_python_base_image():
    assert instructions()[0] == ("FROM", "python:3.11-slim")


def test_runs_as_a_non_root_user_after_every_install():
    steps = instructions()
    users = [i for i, (keyword, _) in enumerate(steps) if keyword == "USER"]
    assert users and steps[users[-1]][1] == "10001"
    runs = [i for i, (keyword, _) in enumerate(steps) if keyword == "RUN"]
    assert max(runs) < users[-1], "nothing may be installed after switching to the user"


def test_health_check_calls_check_consumer_health_for_real():
    [(_, healthcheck)] = [step for step in instructions() if step[0] == "HEALTHCHECK"]
    command = json.loads(healthcheck.split("CMD", 1)[1])
    assert command == ["check_consumer_health"]  # exec form: no `|| exit 0` can hide a failure


def test_entrypoint_runs_messenger_consume_as_pid_1():
    steps = dict(instructions())
    assert json.loads(steps["ENTRYPOINT"]) == ["consumer-entrypoint"]
    assert json.loads(steps["CMD"])[0].count(":") == 1  # 'package.module:Class'
    script = (ROOT / "consumer_image" / "entrypoint.sh").read_text()
    assert 'exec messenger consume "$@"' in script


def test_every_copied_path_passes_the_root_dockerignore():
    # The build context is the repository root, filtered by .dockerignore ('**' then '!path').
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for keyword, rest in instructions():
        if keyword == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                top = source.replace("${APP_DIR}", "examples").rstrip("/").split("/")[0]
                assert top in allowed, f"COPY {source}: not in the build context"


def test_entrypoint_without_arguments_explains_its_usage():
    result = subprocess.run(
        ["sh", str(ROOT / "consumer_image" / "entrypoint.sh")], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "package.module:ConsumerClass" in result.stderr


def test_the_dockerfile_trusts_no_extra_certificates():
    # Local builds reach PyPI through a proxy whose CA only the stand-in base image carries
    # (consumer_image/build_local.sh); a deployed image must not inherit that trust.
    text = DOCKERFILE.read_text().lower()
    for needle in ("cert", "pip.conf", "trusted-host", "ca_bundle", "ssl", "index-url"):
        assert needle not in text, needle
