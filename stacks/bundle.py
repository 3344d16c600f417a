"""Asset staging in plain Python at synth time: no Docker, no network.

A Lambda bundle is the function's folder (kept as the package `lambdas.<name>`) plus the
`messenger` library and the pure-Python packages it needs, copied from the virtualenv the app runs
in, so the deployed code is exactly the code the tests ran against (versions pinned in
requirements.txt). The EMR library bundle is the part of `messenger` a step imports and
`spark_jobs` (boto3 comes with EMR). A Lambda bundle carries its modules' bytecode
(`compile_bytecode`).
"""

from __future__ import annotations

import atexit
import compileall
import importlib.util
import py_compile
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
#: What the ops Lambdas import besides `messenger` (boto3 comes with the Lambda runtime).
LAMBDA_PACKAGES = (
    "aws_lambda_powertools",
    "slack_sdk",
    "typing_extensions",
    "aws_xray_sdk",
    "wrapt",
    "filelock",
)
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "tests", "*.dist-info")
#: The Python of the stacks' Lambda runtimes (PYTHON_3_11): a bundle staged by this Python
#: carries its bytecode, since Lambda cannot write __pycache__ into the function's read-only
#: folder and would compile every module from source at each cold start (about 100 ms of a
#: consumer function's import, bench/cold_start.py).
LAMBDA_PYTHON = (3, 11)
#: Never part of a team's code in a bundle: caches, virtualenvs, build output, version control.
IGNORE_CODE = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "*.pyo", ".venv", "venv", ".git", "cdk.out", "node_modules",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", "*.egg-info",
)
_staged: dict[tuple[str, ...], Path] = {}
_root: Path | None = None


class BundleError(RuntimeError):
    """A bundle cannot be staged (missing function folder or package)."""


def staging_root() -> Path:
    """A temporary folder for staged assets, removed when the process ends."""
    global _root
    if _root is None:
        _root = Path(tempfile.mkdtemp(prefix="messenger-bundles-"))
        atexit.register(shutil.rmtree, _root, True)
    return _root


def _copy_package(name: str, target: Path) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise BundleError(
            f"package {name!r} is not installed in {REPO_ROOT / '.venv'}; run `make test` "
            f"or `pip install -r requirements.txt` first"
        )
    origin = Path(spec.origin)
    if origin.name == "__init__.py":
        shutil.copytree(origin.parent, target / name, ignore=_IGNORE)
    else:
        shutil.copy2(origin, target / origin.name)


def lambda_bundle(function: str, packages: Sequence[str] = LAMBDA_PACKAGES) -> Path:
    """A directory holding `lambdas/<function>/`, `messenger/` and `packages` (staged once)."""
    cache_key = ("lambda", function, *packages)
    if cache_key in _staged:
        return _staged[cache_key]
    source = REPO_ROOT / "lambdas" / function
    if not (source / "handler.py").is_file():
        raise BundleError(f"Lambda function folder {source} has no handler.py")
    target = staging_root() / f"lambda-{function}"
    shutil.copytree(source, target / "lambdas" / function, ignore=_IGNORE)
    package_init = REPO_ROOT / "lambdas" / "__init__.py"
    if package_init.is_file():
        shutil.copy2(package_init, target / "lambdas" / "__init__.py")
    shutil.copytree(REPO_ROOT / "messenger", target / "messenger", ignore=_IGNORE)
    for package in packages:
        _copy_package(package, target)
    compile_bytecode(target)
    _staged[cache_key] = target
    return target


def compile_bytecode(folder: Path) -> bool:
    """Write the bytecode of every module under `folder` when this Python is the Lambda
    runtime's (another would not read it: its files are named for this one); True if written.
    Checked by source hash, not time: a copy that changes the files' times keeps it valid, and
    the same sources give the same bytes (the asset's hash does not change from run to run)."""
    if sys.version_info[:2] != LAMBDA_PYTHON:
        return False
    return bool(compileall.compile_dir(
        str(folder), quiet=2, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH))


def library_bundle() -> Path:
    """A directory holding the EMR part of `messenger/` (the files `messenger emr submit` zips:
    `messenger.emr_step.emr_package_files`) and `spark_jobs/`, zipped by its asset: the EMR
    steps' --py-files, so a job may import the library and its sibling modules. Nothing else:
    EMR's Python provides boto3."""
    from messenger.emr_step import emr_package_files

    cache_key = ("library",)
    if cache_key not in _staged:
        target = staging_root() / "library"
        for name, source in emr_package_files(REPO_ROOT / "messenger"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
        jobs = REPO_ROOT / "spark_jobs"
        if jobs.is_dir():
            shutil.copytree(jobs, target / "spark_jobs", ignore=_IGNORE)
        _staged[cache_key] = target
    return _staged[cache_key]


def spark_job_scripts() -> list[Path]:
    """The EMR step scripts: `spark_jobs/*.py` with a `__main__` block (not `_private.py`)."""
    folder = REPO_ROOT / "spark_jobs"
    return sorted(
        path for path in folder.glob("*.py")
        if not path.name.startswith("_") and "__main__" in path.read_text(encoding="utf-8")
    )


def consumer_lambda_bundle(code_dir: Path) -> Path:
    """The consumer function's bundle (`lambda_bundle("consumer")`) plus a team's code folder
    at its root, where the handler imports the consumer class from (staged once per folder)."""
    cache_key = ("consumer-lambda", str(code_dir))
    if cache_key not in _staged:
        base = lambda_bundle("consumer")
        target = staging_root() / f"consumer-lambda-{len(_staged)}-{code_dir.name}"
        shutil.copytree(base, target)
        shutil.copytree(code_dir, target / code_dir.name, ignore=IGNORE_CODE)
        compile_bytecode(target / code_dir.name)
        _staged[cache_key] = target
    return _staged[cache_key]
