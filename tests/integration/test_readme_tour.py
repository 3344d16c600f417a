"""The README's tour works as a newcomer types it: `hello.py` in an empty folder, a push, and the
`messenger` console script consuming `hello:GreetingConsumer` from that folder (the working
directory on the import path, as `python -m` has it), against the moto server over HTTP."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from messenger.settings import Settings
from tests.docs import code_blocks, doc_text

ROOT = Path(__file__).resolve().parents[2]
TOUR = doc_text("README.md", "Five-minute tour")
BIN = Path(sys.executable).parent  # the virtualenv's bin/: messenger, python


def _commands() -> list[list[str]]:
    """The shell commands of the tour's bash blocks that run in the user's folder."""
    commands = []
    for block in code_blocks(TOUR, "bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and (words[0] == "python" or words[:2] == ["messenger", "consume"]):
                commands.append(words)
    return commands


@pytest.fixture
def user_env(settings: Settings, endpoint: str) -> dict[str, str]:
    """What the user's second terminal has: the `export` lines of `messenger local`, the
    virtualenv activated, nothing of this repository on the import path."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env.update(PATH=f"{BIN}{os.pathsep}{env['PATH']}", PYTHONUNBUFFERED="1",
               MESSENGER_NAMESPACE=settings.namespace, MESSENGER_RETRY_BUDGET="5")
    return env


def _consume(target: str, folder: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(BIN / "messenger"), "consume", target], cwd=folder, env=env,
                            stdout=(folder / "stdout").open("wb"),
                            stderr=(folder / "stderr").open("wb"))


def test_the_tour_pushes_and_consumes_from_the_users_own_folder(
    tmp_path: Path, user_env: dict[str, str],
) -> None:
    # Given hello.py written from the README into an empty folder outside the repository
    (hello,) = [b for b in code_blocks(TOUR, "python") if b.startswith("# hello.py\n")]
    (tmp_path / "hello.py").write_text(hello)
    push, consume = _commands()
    assert consume == ["messenger", "consume", "hello:GreetingConsumer"]
    # When the push runs there, then the console script consumes from there
    pushed = subprocess.run(push, cwd=tmp_path, env=user_env, capture_output=True, text=True,
                            timeout=60)
    assert pushed.returncode == 0, pushed.stderr
    message_id = pushed.stdout.strip()
    process = _consume(consume[2], tmp_path, user_env)
    try:
        deadline = time.monotonic() + 30
        while "hello, Ada" not in (tmp_path / "stdout").read_text():
            assert process.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
            assert time.monotonic() < deadline, (tmp_path / "stderr").read_text()[-2000:]
            time.sleep(0.05)
        # Then the handler ran on the pushed message, and Ctrl-C stops the consumer cleanly
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log = (tmp_path / "stderr").read_text()
    assert message_id in log and '"completed"' in log
    # And the README's other commands that need no deployment work as written there
    for command in _other_commands():
        done = subprocess.run(command, cwd=tmp_path, env=user_env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (command, done.stdout[-1000:], done.stderr[-1000:])


def _other_commands() -> list[list[str]]:
    """The README's `messenger` commands besides the tour's (top, dlq, requeue, --help)."""
    commands = []
    for block in code_blocks(doc_text("README.md"), "bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["messenger"] and words[1] in ("top", "dlq", "requeue", "--help"):
                commands.append(words)
    assert {words[1] for words in commands} == {"top", "dlq", "requeue", "--help"}, commands
    return commands


@pytest.mark.parametrize(("module", "source", "named"), [
    ("nothere", None, "nothere"),
    ("broken", "import not_installed_dependency\n", "not_installed_dependency"),
])
def test_a_module_that_cannot_be_imported_gives_one_line_naming_it_and_exit_2(
    tmp_path: Path, user_env: dict[str, str], module: str, source: str | None, named: str,
) -> None:
    # Given a folder without the module, or with one whose own import fails
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    process = _consume(f"{module}:Missing", tmp_path, user_env)
    # Then one line says which module and why, and the exit code is 2
    assert process.wait(timeout=60) == 2
    lines = (tmp_path / "stderr").read_text().strip().splitlines()
    assert len(lines) == 1 and module in lines[0] and named in lines[0], lines
    if source is None:  # not found: the line says where it looked and what to do
        assert str(tmp_path) in lines[0] and "run from the folder that holds" in lines[0]
