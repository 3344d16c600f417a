"""The reliability suite's ledger: every acknowledged send against what consumers processed and
what is still in the queue and its DLQ; consumers run as real `messenger consume` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from messenger import Producer, Settings
from messenger.aws import ClientFactory
from messenger.channel import physical_name
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE
from tests.integration.helpers import drain
from tests.integration.test_consumer_process import ConsumerProcess as IntegrationConsumerProcess
from tests.reliability.apps import CHANNEL

ROOT = Path(__file__).resolve().parents[2]
APPS = "tests.reliability.apps"
#: One report line per test, printed in the terminal summary.
REPORTS: list[dict[str, Any]] = []


@dataclass
class Ledger:
    """What producers acknowledged and what each part of the system holds, by message id."""

    acknowledged: list[str] = field(default_factory=list)
    processed: list[str] = field(default_factory=list)
    in_queue: list[str] = field(default_factory=list)
    in_dlq: list[str] = field(default_factory=list)
    #: message id -> dead_letter_reason of the DLQ copy ('' when SQS's redrive moved it).
    dlq_reasons: dict[str, str] = field(default_factory=dict)

    @property
    def lost(self) -> set[str]:
        return set(self.acknowledged) - set(self.processed) - set(self.in_queue) - set(self.in_dlq)

    @property
    def duplicates(self) -> int:
        """Extra handler runs: processed count minus distinct processed."""
        return len(self.processed) - len(set(self.processed))

    def report(self, test: str, **extra: Any) -> dict[str, Any]:
        repeated = Counter(self.processed)
        return {
            "test": test, "acknowledged": len(self.acknowledged),
            "processed_distinct": len(set(self.processed)), "duplicates": self.duplicates,
            "most_runs": max(repeated.values(), default=0), "in_queue": len(self.in_queue),
            "in_dlq": len(self.in_dlq), "lost": len(self.lost), **extra,
        }


class ConsumerProcess(IntegrationConsumerProcess):
    """One `messenger consume` child process of APPS and its JSON log (no handler record: the
    ledger files take its place)."""

    def __init__(self, app: str, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "messenger", "consume", f"{APPS}:{app}"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_listening(self, timeout: float = 30.0) -> None:
        self.wait_for_state("LISTENING", timeout)

    def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM once the consumer is listening (its signal handlers are installed by then);
        returns the exit code."""
        self.wait_listening()
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)


class Harness:
    """Starts consumers with the ledger's files and collects the ledger at the end."""

    def __init__(self, settings: Settings, clients: ClientFactory, workdir: Path) -> None:
        self.settings = settings
        self.clients = clients
        self.workdir = workdir
        self.files = {name: workdir / f"{name}.txt" for name in ("ledger", "attempts", "faults")}
        self.started: list[ConsumerProcess] = []

    def start(self, app: str = "LedgerConsumer", **extra_env: str) -> ConsumerProcess:
        env = {
            **os.environ, **self.settings.as_env(),
            "RELIABILITY_LEDGER": str(self.files["ledger"]),
            "RELIABILITY_ATTEMPTS": str(self.files["attempts"]),
            "RELIABILITY_FAULTS": str(self.files["faults"]),
            "MESSENGER_HEALTH_FILE": str(self.workdir / "health.json"),
            "MESSENGER_SHUTDOWN_TIMEOUT": "10",
            "PYTHONUNBUFFERED": "1",
            **extra_env,
        }
        consumer = ConsumerProcess(app, env, self.workdir / f"consumer-{len(self.started)}.log")
        self.started.append(consumer)
        return consumer

    def lines(self, name: str) -> list[str]:
        path = self.files[name]
        return path.read_text().splitlines() if path.exists() else []

    def processed(self) -> list[str]:
        return self.lines("ledger")

    def queue_url(self, dlq: bool = False) -> str:
        name = physical_name(CHANNEL + ("-dlq" if dlq else ""), self.settings.namespace)
        return str(self.clients.client("sqs").get_queue_url(QueueName=name)["QueueUrl"])

    def wait_processed(self, expected: Iterable[str], timeout: float) -> None:
        """Until every id of `expected` is in the ledger, or `timeout` seconds."""
        wanted = set(expected)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not wanted <= set(self.processed()):
            time.sleep(0.2)

    def collect(self, acknowledged: Iterable[str]) -> Ledger:
        """The ledger, draining what the queue and the DLQ still hold (consumers stopped)."""
        ledger = Ledger(acknowledged=list(acknowledged), processed=self.processed())
        sqs = self.clients.client("sqs")
        ledger.in_queue = [message_id_of(raw) for raw in drain_all(sqs, self.queue_url())]
        for raw in drain_all(sqs, self.queue_url(dlq=True)):
            message_id = message_id_of(raw)
            ledger.in_dlq.append(message_id)
            reason = raw.get("MessageAttributes", {}).get(DEAD_LETTER_REASON_ATTRIBUTE, {})
            ledger.dlq_reasons[message_id] = reason.get("StringValue", "")
        return ledger


def drain_all(sqs: Any, url: str, timeout: float = 25.0) -> list[dict[str, Any]]:
    """Receive and delete every message of a queue, also those a stopped consumer's last long
    poll still took (moto answers it after the process is gone; they are back when their lease
    ends): drains until the queue holds nothing, visible or not, or `timeout` seconds."""
    received: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        received += drain(sqs, url)
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
        ])["Attributes"]
        if not any(int(value) for value in attributes.values()) \
                or time.monotonic() > deadline:
            return received
        time.sleep(0.5)


def message_id_of(raw: dict[str, Any]) -> str:
    """The producer's id of a raw message (the SQS MessageId when it has none)."""
    attribute = raw.get("MessageAttributes", {}).get("message_id", {})
    return str(attribute.get("StringValue") or raw["MessageId"])


@pytest.fixture
def harness(settings: Settings, clients: ClientFactory, tmp_path: Path) -> Iterator[Harness]:
    made = Harness(settings, clients, tmp_path)
    yield made
    for consumer in made.started:
        consumer.stop()


@pytest.fixture
def producer_class() -> type[Producer]:
    class ReliabilityProducer(Producer):
        channel = CHANNEL

    return ReliabilityProducer


@pytest.fixture
def report(record_property: Callable[[str, Any], None]) -> Callable[[dict[str, Any]], None]:
    """Attach a test's one-line report to its result and to the terminal summary."""

    def publish(line: dict[str, Any]) -> None:
        record_property("reliability", json.dumps(line))
        REPORTS.append(line)

    return publish


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORTS:
        terminalreporter.section("reliability ledger")
        for line in REPORTS:
            terminalreporter.write_line(json.dumps(line))
