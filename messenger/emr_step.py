"""What an EMR step of messenger is made of: the part of the library it ships, the Python it runs
on and where its code is uploaded.

Facts shared by `messenger emr submit` (`messenger.tools.emr`) and the CDK pipeline
(`stacks.emr_pipeline`, `stacks.bundle`), so that the stacks import no command module.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

#: Key prefix of the code bucket under which `messenger emr submit` uploads a step's code.
CODE_PREFIX = "emr"
#: Name of the library's archive a step gets as --py-files.
PACKAGE_ZIP = "messenger.zip"
#: The Python of the Spark driver and executors. emr-7.x nodes have Python 3.9 (`python3`, what
#: Spark uses unless told) and 3.11; the EMR package runs on both, and steps choose 3.11.
EMR_PYTHON = "/usr/bin/python3.11"
#: Subpackages of messenger that EMR steps import (besides the core modules and spark.py).
EMR_PARTS = ("produce", "jobs")
#: Core modules that are commands, not library: left out of the EMR package.
EMR_EXCLUDED_MODULES = frozenset({"__main__.py"})
#: Fixed timestamp for zip entries so that the same sources give the same bytes (and S3 keys).
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def emr_package_files(package_dir: Path | None = None) -> list[tuple[str, Path]]:
    """What of `messenger` an EMR step needs, as (name in the archive, source path), sorted:
    the core modules, `EMR_PARTS` and `messenger.spark`. Neither the consumer runtime (filelock,
    threads) nor the tools go to the cluster; everything here runs on Python 3.9 and needs only
    boto3, which EMR's Python provides (`tests/unit/test_emr_python.py` checks both)."""
    root = package_dir or Path(__file__).resolve().parent
    files = [path for path in root.glob("*.py") if path.name not in EMR_EXCLUDED_MODULES]
    for part in EMR_PARTS:
        files += (root / part).glob("*.py")
    return sorted((f"{root.name}/{path.relative_to(root).as_posix()}", path) for path in files)


def package_zip(package_dir: Path | None = None) -> bytes:
    """The EMR part of messenger (`emr_package_files`) as a zip for --py-files:
    `messenger/...py` at the top level, sorted, fixed timestamps, no caches."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path in emr_package_files(package_dir):
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


def python_confs(python: str = EMR_PYTHON) -> list[str]:
    """spark-submit arguments choosing `python` for the driver (in YARN's application master)
    and the executors: the `spark.pyspark.*` settings win over any PYSPARK_PYTHON of the
    cluster's spark-env, and the environment variables cover code that reads them."""
    confs = {
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": python,
        "spark.yarn.appMasterEnv.PYSPARK_PYTHON": python,
        "spark.executorEnv.PYSPARK_PYTHON": python,
    }
    return [arg for name, value in confs.items() for arg in ("--conf", f"{name}={value}")]
