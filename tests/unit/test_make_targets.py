"""`make test` hands its ARGS to pytest as given (what the README and docs/local-development.md
show), and runs every test without them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pytest_line(*make_args: str) -> str:
    # -n prints the recipe without running it; -o keeps the set-up steps out of the listing
    # (a make that runs this test hands its command-line variables, e.g. ARGS, down through
    # MAKEFLAGS: the dry run gets only its own)
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS", "TEST_WORKERS")}
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "-o", "node_modules/.installed", "test",
         *make_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=True,
    )
    (line,) = [line for line in dry.stdout.splitlines() if " -m pytest" in line]
    return line


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_passes_args_to_pytest() -> None:
    assert _pytest_line().rstrip() == ".venv/bin/python -m pytest -n 4 --dist loadgroup"
    assert _pytest_line("ARGS=tests/unit -x -k 'a or b'") == (
        ".venv/bin/python -m pytest -n 4 --dist loadgroup tests/unit -x -k 'a or b'"
    )
    assert _pytest_line("TEST_WORKERS=0").rstrip() == (
        ".venv/bin/python -m pytest -n 0 --dist loadgroup"
    )
