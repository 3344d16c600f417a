"""The consumer as ECS runs it: `python -m messenger consume module:Class` as a real process,
stopped with real signals, against the moto server over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from messenger import Producer, Settings
from messenger.aws import ClientFactory
from messenger.channel import physical_name
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE

ROOT = Path(__file__).resolve().parents[2]
#: Bound of a wait for an event of a consumer's log (its start, a handler's end): a hang, not an
#: expected duration; on a busy machine a consumer's start alone can take 20 s.
EVENT_WAIT_SECONDS = 90.0
APPS = "tests.integration.consumer_apps.apps"
CHANNEL = "consumer_test"  # the channel of every consumer in APPS


class ConsumerProcess:
    """One `messenger consume` child process, its JSON log and its handler record.

    log_path: this process's own log file. Two processes must never share one: each open() has
    its own file offset, so their lines would overwrite each other's (torn, glued lines)."""

    def __init__(self, app: str, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.record_path = Path(env["CONSUMER_TEST_RECORD"])
        self.health_path = Path(env["MESSENGER_HEALTH_FILE"])
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "messenger", "consume", f"{APPS}:{app}"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines of the log. Only whole lines are read: the text after the last newline
        is a line still being written, or one that a kill -9 cut short. Every whole line that
        starts a JSON object must parse (the consumer writes each line with one write)."""
        text = self.log_path.read_bytes()
        whole = text[:text.rfind(b"\n") + 1].decode()
        return [json.loads(line) for line in whole.splitlines() if line.startswith("{")]

    def records(self) -> list[dict[str, Any]]:
        if not self.record_path.exists():
            return []
        return [json.loads(line) for line in self.record_path.read_text().splitlines()]

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool],
                 timeout: float = EVENT_WAIT_SECONDS) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if predicate(event):
                    return event
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no such event; log:\n{self.log_path.read_text()[-3000:]}")

    def wait_for_event(self, name: str, timeout: float = EVENT_WAIT_SECONDS) -> dict[str, Any]:
        return self.wait_for(lambda event: event.get("event") == name, timeout)

    def wait_for_state(self, state: str, timeout: float = EVENT_WAIT_SECONDS) -> dict[str, Any]:
        return self.wait_for(
            lambda event: event.get("event") == "state" and event.get("state") == state, timeout
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture
def start(settings: Settings, tmp_path: Path) -> Iterator[Callable[..., ConsumerProcess]]:
    started: list[ConsumerProcess] = []

    def run(app: str, **extra_env: str) -> ConsumerProcess:
        env = {
            **os.environ, **settings.as_env(),
            "CONSUMER_TEST_RECORD": str(tmp_path / "record.jsonl"),
            "MESSENGER_HEALTH_FILE": str(tmp_path / "health.json"),
            "MESSENGER_SHUTDOWN_TIMEOUT": "10",
            "PYTHONUNBUFFERED": "1",
            **extra_env,
        }
        process = ConsumerProcess(app, env, tmp_path / f"{app}-{len(started)}.log")
        started.append(process)
        return process

    yield run
    for process in started:
        process.stop()


@pytest.fixture
def producer(settings: Settings) -> Producer:
    class TestProducer(Producer):
        channel = CHANNEL

    return TestProducer(settings=settings)


def queue_url(clients: ClientFactory, settings: Settings, dlq: bool = False) -> str:
    name = physical_name(CHANNEL + ("-dlq" if dlq else ""), settings.namespace)
    return str(clients.client("sqs").get_queue_url(QueueName=name)["QueueUrl"])


def messages_held(clients: ClientFactory, url: str) -> int:
    """Messages in the queue, visible or not."""
    attributes = clients.client("sqs").get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


@pytest.mark.timeout(300)  # a hang: the waits inside are bounded by events
def test_sigterm_lets_the_running_handler_finish_then_exits_0(start, producer, clients, settings):
    # Given a consumer in the middle of a 5 s handler
    consumer = start("SleepyConsumer")
    producer.push({"sleep": 5})
    consumer.wait_for_event("started")
    # When ECS stops the task
    stopped_at = time.monotonic()
    consumer.process.send_signal(signal.SIGTERM)
    code = consumer.process.wait(timeout=20)
    took = time.monotonic() - stopped_at
    # Then the handler completed, the message is deleted and the exit is clean and in time
    assert code == 0
    assert took < 10, f"took {took:.1f} s, the shutdown timeout is 10 s"
    assert [r["event"] for r in consumer.records()] == ["start", "end"]
    names = [e.get("event") for e in consumer.events()]
    assert "completed" in names
    states = [e["state"] for e in consumer.events() if e.get("event") == "state"]
    assert states[-2:] == ["EXITING", "EXITED"]
    assert messages_held(clients, queue_url(clients, settings)) == 0


@pytest.mark.timeout(300)  # a hang: the waits inside are bounded by events
def test_sigterm_when_idle_stops_at_once_without_waiting_for_the_long_poll(start):
    consumer = start("SleepyConsumer")
    consumer.wait_for_state("LISTENING")
    time.sleep(0.5)  # the 20 s long poll is outstanding now
    stopped_at = time.monotonic()
    consumer.process.send_signal(signal.SIGTERM)
    assert consumer.process.wait(timeout=20) == 0
    assert time.monotonic() - stopped_at < 3


@pytest.mark.timeout(300)  # a hang: the waits inside are bounded by events
def test_sigkill_during_processing_loses_nothing(start, producer, clients, settings):
    # Given a consumer holding a message (2 s lease kept alive by the heartbeat)
    consumer = start("SleepyConsumer")
    producer.push({"sleep": 30})
    consumer.wait_for_event("started")
    time.sleep(1.0)  # the heartbeat has extended the lease at least once
    # When the process dies without any chance to clean up
    consumer.process.send_signal(signal.SIGKILL)
    consumer.process.wait(timeout=10)
    killed_at = time.monotonic()
    # Then the message is delivered again once its lease runs out
    response = clients.client("sqs").receive_message(
        QueueUrl=queue_url(clients, settings), WaitTimeSeconds=10,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )
    messages = response.get("Messages", [])
    assert len(messages) == 1
    assert json.loads(messages[0]["Body"]) == {"sleep": 30}
    assert messages[0]["Attributes"]["ApproximateReceiveCount"] == "2"
    assert time.monotonic() - killed_at < 6


@pytest.mark.timeout(300)  # a hang: the waits inside are bounded by events
def test_handler_past_processing_timeout_goes_to_the_dlq_with_the_reason(
    start, producer, clients, settings
):
    consumer = start("TimeoutConsumer", MESSENGER_CONCURRENCY="2")
    producer.push({"sleep": 6})
    consumer.wait_for_event("dead_lettered")
    response = clients.client("sqs").receive_message(
        QueueUrl=queue_url(clients, settings, dlq=True), WaitTimeSeconds=5,
        MessageAttributeNames=["All"],
    )
    [dead] = response["Messages"]
    assert json.loads(dead["Body"]) == {"sleep": 6}
    reason = dead["MessageAttributes"][DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"]
    assert reason == "processing_timeout: exceeded 2 s"
    assert messages_held(clients, queue_url(clients, settings)) == 0
    # The consumer keeps running and takes the next message (on its other worker: the timed-out
    # thread is still asleep and counted lost until it returns)
    assert consumer.process.poll() is None
    producer.push({"sleep": 0})
    consumer.wait_for(lambda e: e.get("event") == "completed")


@pytest.mark.timeout(300)  # a hang: the waits inside are bounded by events
def test_heartbeat_keeps_a_long_handler_from_being_delivered_twice(
    start, producer, clients, settings
):
    # Given a 2 s queue lease, a 5 s handler and a free worker polling next to it
    consumer = start("SleepyConsumer", MESSENGER_CONCURRENCY="2")
    producer.push({"sleep": 5})
    consumer.wait_for_event("completed")
    time.sleep(1)
    # Then it ran once: the lease was extended while it ran
    assert [r["event"] for r in consumer.records()] == ["start", "end"]
    assert [e.get("event") for e in consumer.events()].count("received") == 1
    assert messages_held(clients, queue_url(clients, settings)) == 0


@pytest.mark.timeout(300)  # a hang: the waits inside are bounded by events
def test_health_check_fails_for_a_consumer_stuck_in_processing(start, producer, tmp_path):
    health_file = str(tmp_path / "health.json")
    health = [sys.executable, "-m", "messenger.consume.health", "--file", health_file]
    consumer = start("StuckConsumer", MESSENGER_HEALTH_GRACE="1", MESSENGER_SHUTDOWN_TIMEOUT="30")
    consumer.wait_for_state("LISTENING")
    assert subprocess.run(health, capture_output=True).returncode == 0
    # When its handler blocks past processing_timeout (2 s) + grace (1 s)
    producer.push({"blocked": True})
    consumer.wait_for_event("timed_out")
    time.sleep(1.5)
    # Then the health check reports it, with exit code 1
    result = subprocess.run(health, capture_output=True, text=True)
    assert result.returncode == 1, result.stdout
    assert "stuck in PROCESSING" in result.stdout


@pytest.mark.timeout(300)  # a hang: the waits inside are bounded by events
def test_sigterm_while_provisioning_against_a_hung_endpoint_exits_0_in_time(start):
    from tests.faults import Blackhole

    # Given a consumer resolving its channel against an endpoint that accepts and never answers
    hung = Blackhole()
    try:
        consumer = start("SleepyConsumer", AWS_ENDPOINT_URL=hung.url,
                         MESSENGER_PROVISIONING="auto")
        deadline = time.monotonic() + 10
        while not hung.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hung.connections, "the consumer never called the endpoint"
        assert json.loads(consumer.health_path.read_text())["state"] == "INITIALIZING"
        # When ECS stops the task
        stopped_at = time.monotonic()
        consumer.process.send_signal(signal.SIGTERM)
        # Then it exits 0 within its shutdown timeout (10 s; ECS kills it at 30 s)
        code = consumer.process.wait(timeout=15)
        took = time.monotonic() - stopped_at
    finally:
        hung.close()
    assert code == 0, consumer.log_path.read_text()[-2000:]
    assert took < 10, f"took {took:.1f} s, the shutdown timeout is 10 s"
    states = [e["state"] for e in consumer.events() if e.get("event") == "state"]
    assert states == ["INITIALIZING", "EXITING", "EXITED"]


#: Bound of a wait for the health check to give an answer (a consumer's start, a file going
#: stale): a hang, not an expected duration. On a busy machine a consumer's start and each
#: check (a Python process of its own) take seconds each.
HEALTH_WAIT_SECONDS = 90.0


def _health(*prefix: str, file: Path | str) -> subprocess.CompletedProcess[str]:
    """`check_consumer_health --file F`, run after `prefix` (e.g. nsenter into a namespace)."""
    return subprocess.run([*prefix, sys.executable, "-m", "messenger.consume.health",
                           "--file", str(file)], cwd=ROOT, capture_output=True, text=True,
                          timeout=HEALTH_WAIT_SECONDS)


def _until_health(expected: int, *prefix: str, file: Path | str,
                  timeout: float = HEALTH_WAIT_SECONDS) -> subprocess.CompletedProcess[str]:
    """Check until the check exits `expected` (or `timeout` passed: its last answer)."""
    deadline = time.monotonic() + timeout
    while True:
        result = _health(*prefix, file=file)
        if result.returncode == expected or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


def _private_tmpfs_works() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.timeout(600)  # a hang; every wait below ends on the check's own answer
def test_health_check_fails_on_a_full_or_read_only_disk_and_on_a_hung_consumer(
    settings, tmp_path
):
    if not _private_tmpfs_works():
        pytest.skip("needs a private mount namespace (unshare -m, root) for a small tmpfs")
    # Given a consumer whose health file lives on a 64 KiB tmpfs of its own mount namespace
    # (gone with the process: nothing to clean up), rewritten every 0.5 s
    mount = tmp_path / "health"
    mount.mkdir()
    health_file = mount / "health.json"
    env = {**os.environ, **settings.as_env(), "MESSENGER_HEALTH_FILE": str(health_file),
           "MESSENGER_HEALTH_REFRESH_SECONDS": "0.5", "CONSUMER_TEST_RECORD": "/dev/null",
           "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "consumer.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size=64k tmpfs {mount} && exec {sys.executable} -m messenger "
         f"consume {APPS}:SleepyConsumer"], cwd=ROOT, env=env, stdout=log,
        stderr=subprocess.STDOUT)
    inside = ("nsenter", "-t", str(process.pid), "-m")
    try:
        assert _until_health(0, *inside, file=health_file).returncode == 0
        # When the disk fills up: the check fails at once, naming the error (the directory is
        # probed before the file's age: on a busy machine the file, which its writer can no
        # longer refresh, may be stale by the time the check runs; the cause is the disk)
        subprocess.run([*inside, "sh", "-c", f"cat /dev/zero > {mount}/fill"],
                       capture_output=True)
        full = _health(*inside, file=health_file)
        assert full.returncode == 1 and "No space left on device" in full.stdout, full.stdout
        # and passes again once there is room
        subprocess.run([*inside, "rm", f"{mount}/fill"], check=True)
        assert _until_health(0, *inside, file=health_file).returncode == 0
        # When the filesystem turns read-only: it fails
        subprocess.run([*inside, "mount", "-o", "remount,ro", str(mount)], check=True)
        read_only = _health(*inside, file=health_file)
        assert read_only.returncode == 1 and "Read-only file system" in read_only.stdout
        subprocess.run([*inside, "mount", "-o", "remount,rw", str(mount)], check=True)
        assert _until_health(0, *inside, file=health_file).returncode == 0
        # When the process hangs (stopped): the file goes stale within 3 refreshes
        process.send_signal(signal.SIGSTOP)
        hung = _until_health(1, *inside, file=health_file)
        assert hung.returncode == 1 and "has not refreshed" in hung.stdout, hung.stdout
        process.send_signal(signal.SIGCONT)
        assert _until_health(0, *inside, file=health_file).returncode == 0
    finally:
        process.kill()
        process.wait()
        log.close()


@pytest.mark.timeout(300)  # a hang: the waits inside are bounded by events
def test_health_check_fails_once_the_consumer_is_gone(start, tmp_path):
    consumer = start("SleepyConsumer")
    consumer.wait_for_state("LISTENING")
    assert _until_health(0, file=consumer.health_path).returncode == 0
    consumer.process.kill()  # kill -9, or os._exit: nothing runs to say goodbye
    consumer.process.wait()
    gone = _health(file=consumer.health_path)
    assert gone.returncode == 1 and "is not running" in gone.stdout, gone.stdout


FREEZE_PROBE = """
import gc, json, sys, threading, time
from messenger import Consumer, ConsumerSettings
from messenger.consume.lifecycle import ConsumerState

class Probe(Consumer):
    channel = "gc_freeze_test"

    def handler(self, message):
        pass

def listening(health):
    consumer = Probe(runtime=ConsumerSettings(health_file=health))
    thread = threading.Thread(target=consumer.run)
    thread.start()
    deadline = time.monotonic() + 30
    while consumer.state is not ConsumerState.LISTENING and time.monotonic() < deadline:
        time.sleep(0.01)
    return consumer, thread

before = gc.get_freeze_count()
first, thread = listening(sys.argv[1] + "/a.json")
frozen, unfrozen = gc.get_freeze_count(), len(gc.get_objects(generation=2))
first.request_shutdown()
thread.join(30)
second, thread = listening(sys.argv[1] + "/b.json")
again = gc.get_freeze_count()
second.request_shutdown()
thread.join(30)
print(json.dumps({"before": before, "frozen": frozen, "gen2": unfrozen, "again": again}))
"""


def test_the_first_consumer_of_a_process_freezes_the_startup_heap_once(settings: Settings,
                                                                      tmp_path: Path) -> None:
    # Given a fresh interpreter that runs a consumer up to LISTENING, then another one
    env = {**os.environ, **settings.as_env()}
    out = subprocess.run([sys.executable, "-c", FREEZE_PROBE, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    # Then nothing was frozen before; once the first is listening the objects of startup
    # (modules, botocore's models, the clients: tens of thousands) are out of the collector's
    # generations, the oldest nearly empty
    assert counts["before"] == 0
    assert counts["frozen"] > 10_000
    assert counts["gen2"] < counts["frozen"] // 10
    # and the second consumer of the process froze nothing more (the count moves by a few
    # dozen as frozen objects are freed; freezing again would add its ~200,000 objects)
    assert abs(counts["again"] - counts["frozen"]) < 1_000
