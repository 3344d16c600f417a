"""The embedded local AWS endpoint: a moto server on loopback.

    with LocalEndpoint() as endpoint:      # in-process, free port
        os.environ.update(endpoint.env())

`messenger local` runs one in the foreground; `start_local_process()` runs one as a child
process (what the test suite and `make demo` use, so the server has a CPU of its own).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from messenger.errors import MessengerError

LOOPBACK = "127.0.0.1"
READY_PATTERN = re.compile(r"AWS_ENDPOINT_URL=(http://[\d.]+:\d+)")
#: Dummy credentials: moto accepts any, boto3 insists on some.
LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # moto ignores policy conditions: a TLS-only bucket policy would deny every request.
    "MESSENGER_BUCKET_TLS_POLICY": "false",
}


def local_env(url: str) -> dict[str, str]:
    """Environment variables that point boto3 (and every messenger client) at `url`."""
    return {"AWS_ENDPOINT_URL": url, **LOCAL_CREDENTIALS}


class LocalEndpoint:
    """A moto server in a thread of this process, on `host:port` (port 0 = a free one).

    Unless `stock_moto`, moto's SQS gets messenger's index first (messenger.tools.moto_sqs:
    a request costs the same whatever a queue's depth), GetResources by ARN is answered in
    one page as AWS does (messenger.tools.moto_tagging), and SQS and SNS publish their
    CloudWatch metrics as on AWS (messenger.tools.moto_metrics); all patch moto in this
    process. Due one-time EventBridge Scheduler schedules fire through their targets
    (messenger.tools.scheduler_fire), which moto alone never does, the workflows are swept
    every minute as the 15-minute operations run sweeps them on AWS
    (messenger.tools.workflow_sweeper), and DynamoDB's conditional writes are atomic as on AWS
    (messenger.tools.moto_dynamodb), also with `stock_moto`."""

    def __init__(self, host: str = LOOPBACK, port: int = 0, stock_moto: bool = False) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log per request

        #: Whether moto's SQS runs with messenger's index (False: stock, asked or refused).
        self.sqs_indexed = False
        #: Whether SQS and SNS publish their CloudWatch metrics (False: stock moto has none).
        self.metrics_published = False
        from messenger.tools import moto_dynamodb

        #: Whether DynamoDB's conditional writes are atomic, as on AWS (always asked for: a
        #: matter of correctness, not of speed).
        self.dynamodb_atomic = moto_dynamodb.apply()
        if not stock_moto:
            from messenger.tools import moto_metrics, moto_sqs, moto_tagging

            self.sqs_indexed = moto_sqs.apply()
            moto_tagging.apply()
            self.metrics_published = moto_metrics.apply()  # wraps the index's methods
            cache_module_list()
        self._server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
        self.url = ""
        self.firer: Any = None
        self.sweeper: Any = None

    def start(self) -> LocalEndpoint:
        from messenger.tools.scheduler_fire import ScheduleFirer, local_clients

        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        self.firer = ScheduleFirer(local_clients(self.url)).start()
        from messenger.tools.workflow_sweeper import WorkflowSweeper

        self.sweeper = WorkflowSweeper(self.url).start()
        return self

    def stop(self) -> None:
        if self.firer is not None:
            self.firer.stop()
        if self.sweeper is not None:
            self.sweeper.stop()
        self._server.stop()

    def env(self) -> dict[str, str]:
        return local_env(self.url)

    def __enter__(self) -> LocalEndpoint:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def cache_module_list() -> None:
    """moto's server routes every request through `moto.backends.list_of_moto_modules`, which
    lists moto's package directory (~170 `isdir` calls) each time: about an eighth of the
    server's CPU per SQS request. The list cannot change while the process runs: it is read
    once (same names, same order)."""
    from moto import backends

    if hasattr(backends.list_of_moto_modules, "original"):  # (read already)
        return
    names = tuple(backends.list_of_moto_modules())

    def list_of_moto_modules() -> Iterator[str]:
        return iter(names)

    list_of_moto_modules.original = backends.list_of_moto_modules  # type: ignore[attr-defined]
    backends.list_of_moto_modules = list_of_moto_modules


def reset(url: str) -> None:
    """Forget every resource on a moto server (its /moto-api/reset call)."""
    request = urllib.request.Request(f"{url}/moto-api/reset", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10):
        pass


@dataclass
class LocalProcess:
    """A moto server running as a child process (`python -m messenger local`)."""

    process: subprocess.Popen[str]
    url: str

    def env(self) -> dict[str, str]:
        return local_env(self.url)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_local_process(
    port: int = 0, timeout: float = 30.0, stock_moto: bool = False
) -> LocalProcess:
    """Start `python -m messenger local` and wait until it prints its endpoint URL.
    `stock_moto`: without messenger's SQS index (what the benchmark compares against)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "messenger", "local", "--port", str(port)]
        + (["--stock-moto"] if stock_moto else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    found: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            match = READY_PATTERN.search(line)
            if match and not found:
                found.append(match.group(1))
        # keep draining so the child never blocks on a full pipe

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise MessengerError("the local endpoint did not start (python -m messenger local)")
        time.sleep(0.05)
    return LocalProcess(process=process, url=found[0])


@contextlib.contextmanager
def endpoint_from_env() -> Iterator[str | None]:
    """Use `AWS_ENDPOINT_URL` when it is set (LocalStack, AWS); else start a local endpoint in a
    child process for the duration (it does not share this process's GIL), pointing the
    environment at it. Yields the local endpoint's URL, or None when one was given."""
    if os.environ.get("AWS_ENDPOINT_URL"):
        yield None
        return
    server = start_local_process()
    os.environ.update(server.env())
    try:
        yield server.url
    finally:
        server.stop()


def serve_forever(host: str, port: int, stock_moto: bool = False) -> int:
    """Run an endpoint until SIGINT/SIGTERM; print the variables to export. Returns exit code."""
    endpoint = LocalEndpoint(host, port, stock_moto=stock_moto).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print("messenger local endpoint running. In another shell:", flush=True)
    for name, value in endpoint.env().items():
        print(f"  export {name}={value}", flush=True)
    sqs = "indexed (messenger.tools.moto_sqs)" if endpoint.sqs_indexed else "stock moto"
    metrics = ("SQS and SNS publish their CloudWatch metrics every minute"
               if endpoint.metrics_published else "no SQS/SNS CloudWatch metrics")
    print(f"SQS: {sqs}; {metrics}; due Scheduler schedules fire; workflows are swept every "
          f"minute. Ctrl-C stops it.", flush=True)
    stop.wait()
    endpoint.stop()
    print("stopped.", flush=True)
    return 0
