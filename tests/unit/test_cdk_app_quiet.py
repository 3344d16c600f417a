"""`npx cdk synth` as the README and the CDK guide give it prints no banner of Node's: the `app`
command of cdk.json starts Python with JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION set, so
jsii's Node process (started when `aws_cdk` is imported) does not print its end-of-life notice
(11 `b'!!...'` lines through Python), whatever the caller's environment (`make synth` sets it
too)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SILENCE = "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION"
BANNER = "end-of-life"


def _without_silence() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != SILENCE}


@pytest.mark.timeout(600)  # two Node processes started by jsii, on a busy machine
def test_the_app_command_of_cdk_json_starts_jsii_without_nodes_banner() -> None:
    # Given cdk.json's app command, run as the CDK CLI runs it (a shell, in the repository),
    # with app.py swapped for what app.py does first (import aws_cdk: jsii starts Node), and a
    # caller's environment without the variable
    app = json.loads((REPO / "cdk.json").read_text())["app"]
    words = shlex.split(app)
    assert words[-1] == "app.py", app
    probe = shlex.join([*words[:-1], "-c", "import aws_cdk; print(aws_cdk.App.__name__)"])
    quiet = subprocess.run(probe, shell=True, cwd=REPO, env=_without_silence(),
                           capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stdout.strip() == "App"
    # Then nothing of the banner is printed (where this Node has one: jsii prints it only for
    # an unsupported Node, and then the same import without the setting shows it)
    bare = subprocess.run([sys.executable, "-c", "import aws_cdk"], cwd=REPO,
                          env=_without_silence(), capture_output=True, text=True, timeout=300)
    if BANNER not in bare.stdout + bare.stderr:
        pytest.skip("this Node is supported by jsii: it prints no banner to silence")
    assert BANNER not in quiet.stdout + quiet.stderr, quiet.stderr
    assert "b'!!" not in quiet.stdout + quiet.stderr
