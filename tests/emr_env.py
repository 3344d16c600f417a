"""The interpreters of an EMR node, for the tests that run messenger as a step would.

`make emr-env` builds them from requirements-emr.txt: `.venv-emr` (Python 3.11, the interpreter
the pipeline chooses, with the release's pyspark and boto3) and `.venv-emr39` (Python 3.9, the
release's default `python3`, with boto3 only). Tests that need one skip when it is missing,
unless MESSENGER_REQUIRE_EMR_ENV=1 (CI), where they fail instead.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EMR_PYTHON = ROOT / ".venv-emr" / "bin" / "python"
EMR_PYTHON39 = ROOT / ".venv-emr39" / "bin" / "python"


def emr_python(path: Path) -> Path:
    """`path` when that interpreter exists; otherwise skip (or fail when it is required)."""
    if path.is_file():
        return path
    message = f"{path} is missing: run `make emr-env` (needs python3.9 and PyPI)"
    if os.environ.get("MESSENGER_REQUIRE_EMR_ENV") == "1":
        pytest.fail(message)
    pytest.skip(message)


def boto3_only_site(target: Path) -> Path:
    """A folder holding boto3 and what it depends on (linked from this interpreter's
    site-packages) and nothing else: what an EMR node's Python gives a job."""
    target.mkdir(parents=True, exist_ok=True)
    pending, seen = ["boto3"], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        dist = importlib.metadata.distribution(name)
        for requirement in dist.requires or []:
            if "extra ==" not in requirement:
                pending.append(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0])
        for file in dist.files or []:
            top = file.parts[0]
            if top.endswith((".dist-info", ".pth")) or top in ("..", "bin", "__pycache__"):
                continue
            source = Path(str(dist.locate_file(top)))
            link = target / top
            if source.exists() and not link.exists():
                link.symlink_to(source, target_is_directory=source.is_dir())
    return target
