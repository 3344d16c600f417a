"""What an EMR step runs: the archive `messenger emr submit` ships imports on the node's Python.

emr-7.x nodes have Python 3.9 (`python3`) and 3.11; the pipeline chooses 3.11, and the archive
also runs on 3.9, with nothing but boto3 (what EMR's Python provides) beside it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from messenger.emr_step import emr_package_files, package_zip
from tests.emr_env import EMR_PYTHON39, boto3_only_site, emr_python

ROOT = Path(__file__).resolve().parents[2]
#: What a job imports from the archive, and what it must not need.
IMPORTS = "import messenger.spark, messenger.produce.producer, messenger.jobs.status"
CHECK = f"""
import importlib.util, json, sys
{IMPORTS}
from messenger import MultiProducer, Settings
from messenger.spark import RowMapping
item = RowMapping(body=["n"], routing_key="key").item({{"n": 1, "key": "A.B"}})
print(json.dumps({{
    "spark": sys.modules["messenger.spark"].__file__,
    "python": list(sys.version_info[:2]),
    "filelock": importlib.util.find_spec("filelock") is not None,
    "loaded": sorted(m.split(".")[0] for m in sys.modules if not m.startswith("_")),
    "item": [item.body, item.routing_key],
}}))
"""


def shipped_sources() -> list[Path]:
    """What runs on the nodes: the archive's files and the jobs (the pipeline ships both)."""
    return [path for _, path in emr_package_files()] + sorted((ROOT / "spark_jobs").glob("*.py"))


def write_zip(tmp_path: Path) -> Path:
    archive = tmp_path / "messenger.zip"
    archive.write_bytes(package_zip())
    return archive


def run_isolated(python: Path | str, archive: Path, site: Path, cwd: Path) -> dict:
    """`CHECK` in `python -I -S`: no site-packages, no PYTHON* variables; sys.path is the
    archive, the boto3-only folder and the standard library."""
    script = f"import sys\nsys.path[:0] = [{str(archive)!r}, {str(site)!r}]\n{CHECK}"
    done = subprocess.run(
        [str(python), "-I", "-S", "-c", script], cwd=cwd, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin"}, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_archive_imports_with_only_boto3_and_the_standard_library(tmp_path: Path) -> None:
    # Given the exact zip `messenger emr submit` uploads, and a folder with boto3's packages only
    archive = write_zip(tmp_path)
    site = boto3_only_site(tmp_path / "site")

    # When an isolated interpreter (no site-packages) imports what a job imports
    found = run_isolated(sys.executable, archive, site, tmp_path)

    # Then it came from the zip, filelock was not even findable, and no third-party package
    # but boto3's (and their own dependencies) was loaded
    assert found["spark"] == str(archive / "messenger" / "spark.py")
    assert found["filelock"] is False
    third_party = set(found["loaded"]) - set(sys.stdlib_module_names)
    assert third_party <= {"messenger", "boto3", "botocore", "s3transfer", "jmespath",
                           "dateutil", "urllib3", "six"}, third_party
    assert found["item"] == [{"n": 1}, "A.B"]


def test_the_archive_imports_on_python_3_9_with_boto3(tmp_path: Path) -> None:
    # Given EMR's default python3 (3.9) with only boto3 installed
    python = emr_python(EMR_PYTHON39)
    archive = write_zip(tmp_path)
    empty = tmp_path / "nothing"
    empty.mkdir()

    # When it imports the archive (its own site-packages hold boto3; -S leaves them out, so
    # they come back through the folder of boto3's packages)
    site = subprocess.run(
        [str(python), "-c", "import boto3, os; print(os.path.dirname(os.path.dirname("
                            "boto3.__file__)))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    found = run_isolated(python, archive, Path(site), tmp_path)

    # Then it imported under 3.9
    assert found["python"] == [3, 9]
    assert found["spark"] == str(archive / "messenger" / "spark.py")
    assert found["item"] == [{"n": 1}, "A.B"]


def test_the_archive_holds_the_producing_side_only() -> None:
    names = zipfile.ZipFile(__import__("io").BytesIO(package_zip())).namelist()
    assert names == [name for name, _ in emr_package_files()]
    assert {"messenger/__init__.py", "messenger/spark.py", "messenger/produce/producer.py",
            "messenger/jobs/status.py", "messenger/offload.py"} <= set(names)
    assert not [n for n in names if n.startswith(("messenger/consume/", "messenger/tools/",
                                                  "messenger/ops/"))]
    assert "messenger/__main__.py" not in names


def test_vermin_finds_nothing_newer_than_python_3_9_in_the_archive() -> None:
    # Given the files of the archive and the jobs; When vermin checks them against 3.9
    paths = [str(path) for path in shipped_sources()]
    done = subprocess.run(
        [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())",
         "--target=3.9-", "--violations", "--no-tips", "--no-parse-comments", *paths],
        capture_output=True, text=True, cwd=ROOT,
    )
    # Then no file needs a newer Python (exit code 0, nothing listed)
    assert done.returncode == 0, done.stdout + done.stderr


def runtime_unions(source: str) -> list[int]:
    """Lines where `X | Y` of types is evaluated at run time (3.10+): in isinstance/issubclass,
    or a module-level alias. vermin cannot tell these from `a | b` of numbers; annotations
    are strings under `from __future__ import annotations` and need no check."""
    lines = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2
                and isinstance(node.args[1], ast.BinOp)
                and isinstance(node.args[1].op, ast.BitOr)):
            lines.append(node.lineno)
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr) and any(
            isinstance(side, (ast.Name, ast.Attribute, ast.Subscript))
            or (isinstance(side, ast.Constant) and side.value is None)
            for side in (value.left, value.right)
        ) and not all(isinstance(side, ast.Constant) for side in (value.left, value.right)):
            lines.append(node.lineno)
    return lines


def test_no_type_unions_are_evaluated_at_run_time_in_the_archive() -> None:
    found = {path.name: runtime_unions(path.read_text("utf-8")) for path in shipped_sources()}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_the_runtime_union_check_sees_what_python_3_9_rejects() -> None:
    assert runtime_unions("A = str | None\nisinstance(1, int | float)\n") == [2, 1]
    assert runtime_unions("FLAGS = 1 | 2\ndef f(a: int | None) -> None: ...\n") == []
