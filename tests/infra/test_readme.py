"""Every snippet of the CDK guide (docs/cdk-guide.md) runs, or is checked, exactly as written."""

from __future__ import annotations

import json
import re
import shlex

import aws_cdk as cdk
import pytest

from app import read_config
from stacks.bundle import spark_job_scripts
from tests.docs import code_blocks, doc_text
from tests.infra.conftest import CDK_GUIDE, REPO, TeamApp

SECTION = doc_text(CDK_GUIDE)


def test_every_python_snippet_ran_in_the_team_app(team_app: TeamApp) -> None:
    # The team_app fixture wrote each file snippet to the team's folder and ran the app.py one
    for block in code_blocks(SECTION, "python"):
        path = block.splitlines()[0].removeprefix("# ").split(",")[0].split()[0]
        if path != "app.py":
            assert (team_app.folder / path).read_text() == block
    assert f"{team_app.folder.name}" and team_app.templates


def _commands() -> list[list[str]]:
    """Each shell command of the section's bash blocks (continuations and quotes joined)."""
    commands, pending = [], ""
    for block in code_blocks(SECTION, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            pending += line + "\n"
            try:
                words = shlex.split(pending, comments=True)
            except ValueError:  # an open quote: the command goes on
                continue
            pending = ""
            if words:
                commands.append(words)
    assert not pending
    return commands


def test_make_and_cdk_commands_use_real_targets_and_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    makefile = (REPO / "Makefile").read_text()
    app_source = (REPO / "app.py").read_text()
    cdk_commands = [c for c in _commands() if c[:2] == ["npx", "cdk"]]
    assert cdk_commands
    for command in _commands():
        if command[0] == "make":
            assert re.search(rf"^{command[1]}:", makefile, re.MULTILINE), command
    monkeypatch.delenv("CDK_DEFAULT_ACCOUNT", raising=False)
    monkeypatch.delenv("CDK_DEFAULT_REGION", raising=False)
    for command in cdk_commands:
        assert command[2] in ("synth", "deploy", "diff", "destroy"), command
        context = {}
        for flag, value in zip(command, command[1:], strict=False):
            if flag in ("-c", "--context"):
                key, _, setting = value.partition("=")
                assert f'context("{key.removeprefix("messenger:")}"' in app_source, key
                context[key] = setting
        # The documented context is read, typed and accepted as given
        config = read_config(cdk.App(context=context))
        if "messenger:namespace" in context:
            assert config.namespace == context["messenger:namespace"]


def test_every_documented_context_key_is_read_by_the_app() -> None:
    app_source = (REPO / "app.py").read_text()
    documented = set(re.findall(r"^\| `(messenger:[a-z-]+)`", SECTION, re.MULTILINE))
    documented |= set(re.findall(r"`(messenger:(?:account|region))`", SECTION))
    assert len(documented) >= 8
    for key in documented:
        assert f'context("{key.removeprefix("messenger:")}"' in app_source, key


def test_the_state_machine_input_names_a_deployed_job() -> None:
    (command,) = [c for c in _commands() if c[:2] == ["aws", "stepfunctions"]]
    payload = json.loads(command[command.index("--input") + 1])
    assert payload["job"] in {script.stem for script in spark_job_scripts()}
    assert all(isinstance(arg, str) for arg in payload["args"])
