"""A Lambda consumer's cold start loads and makes only what a plain consumer needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from messenger.aws import ClientFactory
from messenger.provision import Provisioner
from messenger.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
#: What a consumer that neither traces, validates with a model, tracks status nor is idempotent
#: never needs (issue 44).
OPTIONAL = ("pydantic", "opentelemetry", "messenger.jobs.status", "messenger.consume.tracking",
            "messenger.consume.idempotency", "aws_lambda_powertools.utilities.idempotency",
            "aws_xray_sdk")


def test_importing_the_consumer_function_loads_no_optional_feature() -> None:
    # Given a fresh interpreter, as Lambda starts one
    code = (
        "import json, sys\n"
        "import lambdas.consumer.handler\n"
        f"optional = {OPTIONAL!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "                        if any(m == n or m.startswith(n + '.') for n in optional))))\n"
    )
    # When it imports the consumer function's module
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    # Then none of them is loaded
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_a_queues_arn_comes_from_its_url_without_sts() -> None:
    provisioner = Provisioner(ClientFactory("eu-west-1"), Settings(region="eu-west-1"))
    url = "https://sqs.eu-west-1.amazonaws.com/123456789012/prod-orders"
    assert provisioner.queue_arn(url, "prod-orders") == (
        "arn:aws:sqs:eu-west-1:123456789012:prod-orders")
    # the local endpoint's URLs have the same shape
    assert provisioner.queue_arn("http://127.0.0.1:4566/123456789012/orders.fifo",
                                 "orders.fifo") == "arn:aws:sqs:eu-west-1:123456789012:orders.fifo"


def test_a_lambda_bundle_carries_bytecode_valid_whatever_its_files_times(tmp_path: Path) -> None:
    import importlib.util
    import os

    import pytest

    from stacks.bundle import LAMBDA_PYTHON, compile_bytecode

    if sys.version_info[:2] != LAMBDA_PYTHON:
        pytest.skip(f"bytecode is staged only by Python {LAMBDA_PYTHON}")
    # Given a module staged in a bundle
    module = tmp_path / "team" / "jobs.py"
    module.parent.mkdir()
    module.write_text("X = 1\n")
    # When its bytecode is compiled, then the module's times change (a zip, a copy)
    assert compile_bytecode(tmp_path)
    os.utime(module, (1, 1))
    # Then its bytecode is still the one Python loads: checked by the source's hash, not time
    cached = Path(importlib.util.cache_from_source(str(module)))
    data = cached.read_bytes()
    flags = int.from_bytes(data[4:8], "little")
    assert flags == 0b01  # hash-based, unchecked
    assert data[8:16] == importlib.util.source_hash(module.read_bytes())

