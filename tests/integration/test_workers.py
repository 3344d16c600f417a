"""Who is working: real `messenger consume` processes register, refresh, leave at a clean exit,
and show as lost after kill -9."""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from messenger.jobs.workers import WorkerRegistry, ecs_task_arn, list_workers
from messenger.operations.snapshot import snapshot
from messenger.tools import cli
from tests.integration.consumer_apps.apps import CHANNEL
from tests.integration.test_consumer_process import start  # noqa: F401 - the fixture

INTERVAL = 1.0


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.timeout(90)
def test_a_worker_appears_counts_then_shows_lost_after_kill_9(start, settings, clients,  # noqa: F811
                                                              capsys, monkeypatch):
    # Given two consumers refreshing every second, one of which processes a message
    first = start("SleepyConsumer", MESSENGER_WORKER_INTERVAL=str(INTERVAL))
    second = start("SleepyConsumer", MESSENGER_WORKER_INTERVAL=str(INTERVAL))
    for process in (first, second):
        process.wait_for_state("LISTENING")
    from messenger import Producer

    class Push(Producer):
        channel = CHANNEL

    Push(settings=settings).push({"sleep": 0})
    # Then both appear, with the processed message counted within a refresh or two
    workers = wait_until(lambda: (lambda found: found if len(found) == 2 and sum(
        w.processed for w in found) == 1 else None)(list_workers(clients, settings, CHANNEL)))
    assert {w.channel for w in workers} == {CHANNEL}
    assert all(not w.lost() and w.state in ("INITIALIZED", "LISTENING", "IDLE") for w in workers)
    assert {int(w.worker_id.split(":")[1]) for w in workers} == {first.process.pid,
                                                                  second.process.pid}
    # And `messenger top` counts them on their channel's row
    assert {r.channel: r.workers for r in snapshot(clients, settings)}[CHANNEL] == 2
    # When one is killed -9 and the other stopped cleanly
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    second.process.send_signal(signal.SIGTERM)
    assert second.process.wait(timeout=30) == 0
    # Then the clean one is gone and the killed one shows as lost after 3 silent intervals
    lost = wait_until(lambda: (lambda found: found if len(found) == 1 and found[0].lost()
                               else None)(list_workers(clients, settings)))
    assert {r.channel: r.workers for r in snapshot(clients, settings)}[CHANNEL] == 0
    assert int(lost[0].worker_id.split(":")[1]) == first.process.pid
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    assert cli.main(["workers", CHANNEL]) == 0
    out = capsys.readouterr().out
    assert "LOST" in out and "1 worker(s), 1 lost" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_registry_failures_never_raise_and_the_ecs_task_is_read(settings, clients):
    # Given the ECS task metadata endpoint
    class Metadata(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            body = json.dumps({"TaskARN": "arn:aws:ecs:us-east-1:1:task/c/abc"}).encode()
            self.send_response(200 if self.path == "/v4/task" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {"ECS_CONTAINER_METADATA_URI_V4": f"http://127.0.0.1:{server.server_port}/v4"}
    try:
        assert ecs_task_arn(env) == "arn:aws:ecs:us-east-1:1:task/c/abc"
        assert ecs_task_arn({}) == ""
        registry = WorkerRegistry(clients, settings, "orders", "app.Orders", environ=env)
        registry.start("LISTENING")
        [entry] = list_workers(clients, settings, "orders")
        assert entry.task_arn == "arn:aws:ecs:us-east-1:1:task/c/abc"
    finally:
        server.shutdown()
    # When the table is gone, a beat and a stop log and count, never raise
    clients.client("dynamodb").delete_table(TableName=registry.table)
    registry.beat("LISTENING", 0, force=True)
    registry.stop()
    assert registry.write_failures == 2
    assert list_workers(clients, settings) == []


def test_without_a_deployed_table_verify_mode_runs_without_a_registry(settings, clients, caplog):
    registry = WorkerRegistry(clients, settings.with_changes(provisioning="verify"), "orders",
                              "app.Orders")
    registry.start("LISTENING")
    registry.beat("LISTENING", 0, force=True)
    registry.stop()
    assert not registry.enabled and registry.write_failures == 0
    assert "worker registry off" in caplog.text and "does not exist" in caplog.text
