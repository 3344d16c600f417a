"""ECS task scale-in protection, against a fake ECS agent endpoint on loopback.

The agent is a real HTTP server speaking the task-protection API
(`PUT $ECS_AGENT_URI/task-protection/v1/state`); the consumer is a real `messenger consume`
process, as on ECS."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from messenger.consume.protection import TaskProtection, expiry_minutes
from tests.integration import test_consumer_process as consumer_process
from tests.integration.test_consumer_process import ConsumerProcess, messages_held, queue_url

# The real consumer process and its producer, as in test_consumer_process.py.
start = consumer_process.start
producer = consumer_process.producer


class FakeAgent:
    """The ECS agent's task-protection endpoint: records each call, answers as told."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.status = 200
        self.answer: Callable[[dict[str, Any]], dict[str, Any]] = lambda body: {
            "protection": {"ProtectionEnabled": body["ProtectionEnabled"],
                           "ExpirationDate": "2030-01-01T00:00:00Z",
                           "TaskArn": "arn:aws:ecs:eu-west-1:123456789012:task/c/t"}}
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                agent.calls.append({"time": time.time(), "path": self.path, "body": body})
                payload = json.dumps(agent.answer(body)).encode()
                self.send_response(agent.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}/api/task-1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self) -> list[dict[str, Any]]:
        return [call["body"] for call in self.calls]

    def wait_for(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.calls) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.calls) >= count, self.calls

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    fake = FakeAgent()
    yield fake
    fake.close()


def _drained(clients, settings, timeout: float = 20.0) -> None:
    url = queue_url(clients, settings)
    deadline = time.monotonic() + timeout
    while messages_held(clients, url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert messages_held(clients, url) == 0


@pytest.mark.timeout(90)
def test_a_consumer_on_ecs_is_protected_exactly_while_it_processes(
    start, producer, agent, clients, settings
):
    # Given a consumer in an ECS task (ECS_AGENT_URI set), idle
    consumer: ConsumerProcess = start("SleepyConsumer", ECS_AGENT_URI=agent.uri)
    consumer.wait_for_state("LISTENING")
    time.sleep(0.5)
    assert agent.calls == []  # idle: nothing to protect, nothing to drop
    # When a 2 s message arrives and is processed
    producer.push({"sleep": 2})
    agent.wait_for(2)
    records = {r["event"]: r for r in consumer.records()}
    # Then protection went on before the handler started and off after it ended
    on, off = agent.calls[:2]
    assert on["path"] == off["path"] == "/api/task-1/task-protection/v1/state"
    # SleepyConsumer.processing_timeout = 40 s: one minute, plus the 5-minute margin
    assert on["body"] == {"ProtectionEnabled": True, "ExpiresInMinutes": 6}
    assert off["body"] == {"ProtectionEnabled": False}
    assert on["time"] <= records["end"]["time"]
    assert off["time"] >= records["end"]["time"]
    assert records["end"]["time"] - records["start"]["time"] >= 2
    _drained(clients, settings)
    consumer.process.terminate()
    assert consumer.process.wait(timeout=20) == 0
    assert len(agent.calls) == 2  # nothing more on shutdown: it was not protected


@pytest.mark.timeout(90)
@pytest.mark.parametrize("failure", ["http-500", "refused", "unreachable"])
def test_a_failing_agent_never_stops_the_consumer(
    start, producer, agent, clients, settings, failure
):
    # Given an agent that fails (500, a failure answer) or a port nobody listens on
    uri = agent.uri
    if failure == "http-500":
        agent.status = 500
    elif failure == "refused":
        agent.answer = lambda body: {"failure": {"Arn": "arn", "Reason": "TASK_NOT_VALID"}}
    else:
        agent.close()
    consumer = start("SleepyConsumer", ECS_AGENT_URI=uri)
    # When messages arrive, Then they are processed and deleted all the same
    producer.push({"sleep": 0.2})
    producer.push({"sleep": 0.2})
    _drained(clients, settings)
    assert [r["event"] for r in consumer.records()].count("end") == 2
    assert consumer.process.poll() is None
    # And the failure is logged, saying what failed
    warning = {"http-500": "the ECS agent answered 500", "refused": "refused",
               "unreachable": "the ECS agent is unreachable"}[failure]
    consumer.wait_for(lambda event: warning in str(event.get("message", "")))


def test_protection_is_renewed_while_busy_and_dropped_once(agent):
    # Given a protection renewed every 0.2 s (in production: half the expiry)
    protection = TaskProtection(agent.uri, expires_in_minutes=1, renew_every=0.2)
    # When busy for a while (until it has been set and renewed three times), then idle
    protection.want(True)
    agent.wait_for(4)
    protection.want(False)
    deadline = time.monotonic() + 5
    while agent.bodies()[-1]["ProtectionEnabled"] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # no renewal once idle
    protection.close()
    bodies = agent.bodies()
    # Then it was renewed several times, and dropped exactly once at the end
    assert bodies[-1] == {"ProtectionEnabled": False}
    assert bodies[:-1] == [{"ProtectionEnabled": True, "ExpiresInMinutes": 1}] * (len(bodies) - 1)
    assert len(bodies) - 1 >= 3


def test_close_drops_a_held_protection(agent):
    protection = TaskProtection(agent.uri, expires_in_minutes=3)
    protection.want(True)
    agent.wait_for(1)
    protection.close()
    assert agent.bodies() == [{"ProtectionEnabled": True, "ExpiresInMinutes": 3},
                              {"ProtectionEnabled": False}]
    protection.want(True)  # after close: nothing more
    time.sleep(0.2)
    assert len(agent.calls) == 2


def test_outside_ecs_nothing_happens():
    protection = TaskProtection.from_env({}, processing_timeout=60)
    assert not protection.enabled
    protection.want(True)
    protection.close()
    assert protection._thread is None


def test_the_expiry_lies_beyond_the_processing_timeout():
    assert expiry_minutes(1) == 6
    assert expiry_minutes(60) == 6
    assert expiry_minutes(61) == 7
    assert expiry_minutes(1800) == 35
    for seconds in (1, 59, 600, 1800):
        assert expiry_minutes(seconds) * 60 > seconds
