"""Groups under kill -9, with real `messenger consume` processes (tests/reliability/
workflow_apps.py): a consumer killed during the barrier write (its write applied or not), a
producer killed between the group's record and its members' sends, and 50 members finishing
at once on 4 consumer processes. In every case the callback runs exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from messenger import Producer
from messenger.channel import ChannelSpec
from messenger.jobs.results import Outcome, ResultStore
from messenger.jobs.workflows import SWEEP_GRACE_SECONDS, State, Workflows
from messenger.provision import Provisioner
from tests.integration.test_consumer_runtime import wait_until
from tests.reliability import workflow_apps
from tests.reliability.conftest import ROOT

#: Bound of a wait: a hang, not an expected duration (a busy machine).
WAIT = 90.0


class Consumers:
    """Starts `messenger consume` processes of a workflow_apps class; stops them all after."""

    def __init__(self, env: dict[str, str], tmp: Path) -> None:
        self.env, self.tmp, self.started = env, tmp, []

    def start(self, cls: str = "Members", **extra: str) -> subprocess.Popen[bytes]:
        n = len(self.started)
        out = open(self.tmp / f"consumer{n}.log", "w")  # noqa: SIM115 - closed in stop
        process = subprocess.Popen(
            [sys.executable, "-m", "messenger", "consume", f"{workflow_apps.__name__}:{cls}"],
            cwd=ROOT, env={**self.env, "MESSENGER_HEALTH_FILE": str(self.tmp / f"h{n}.json"),
                           **extra}, stdout=out, stderr=subprocess.STDOUT)
        self.started.append((process, out))
        return process

    def stop(self) -> None:
        for process, _ in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, out in self.started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
            out.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger"


@pytest.fixture
def consumers(settings, ledger, tmp_path) -> Iterator[Consumers]:
    env = {**os.environ, **settings.as_env(), "WF_LEDGER": str(ledger),
           "PYTHONUNBUFFERED": "1", "MESSENGER_SHUTDOWN_TIMEOUT": "10"}
    started = Consumers(env, tmp_path)
    yield started
    started.stop()


@pytest.fixture
def producer(settings, clients) -> Producer:
    # The channel as its consumers declare it (they would make it the same way)
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        name=workflow_apps.CHANNEL, namespace=settings.namespace, track_status=True,
        keep_results=True, visibility_timeout=2))
    ResultStore(clients, settings).ensure_table()
    Workflows(clients, settings).ensure_table()
    return type("P", (Producer,), {"channel": workflow_apps.CHANNEL})(settings=settings,
                                                                      clients=clients)


def runs(ledger: Path) -> Counter[str]:
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return Counter(line.split()[0] for line in lines)


def dependencies_seen(ledger: Path, job_id: str) -> list[int]:
    return [int(line.split()[1]) for line in ledger.read_text().splitlines()
            if line.split()[0] == job_id]


def queue_empty(clients: Any, settings: Any) -> bool:
    sqs = clients.client("sqs")
    url = sqs.get_queue_url(QueueName=f"{settings.namespace}-{workflow_apps.CHANNEL}")[
        "QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return attributes["ApproximateNumberOfMessages"] == "0" and \
        attributes["ApproximateNumberOfMessagesNotVisible"] == "0"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("write", ["landed", "unsent"])
def test_a_consumer_killed_during_the_barrier_write_sends_the_callback_once(
        write, settings, clients, producer, consumers, ledger):
    # Given a consumer process that dies (SIGKILL) at its first barrier write: after DynamoDB
    # applied it ('landed'), or before the request went out ('unsent')
    doomed = consumers.start(WF_KILL_AT_BARRIER=write)
    # When a group of 3 members with a callback is pushed
    group = producer.group([{"n": n} for n in range(3)], then={"report": 1})
    assert doomed.wait(timeout=WAIT) == -signal.SIGKILL
    # And another consumer takes over (the killed run's message comes back after its lease)
    consumers.start()
    # Then the callback runs once, with each member's result
    wait_until(lambda: runs(ledger)[group.then_id], WAIT)
    wait_until(lambda: queue_empty(clients, settings), WAIT)
    assert runs(ledger)[group.then_id] == 1
    assert dependencies_seen(ledger, group.then_id) == [3]
    progress = Workflows(clients, settings).group(group.group_id)
    assert progress.state is State.RELEASED and progress.finished == 3 and progress.failed == 0
    assert progress.late == ()


PRODUCER = textwrap.dedent("""
    import os, signal, sys
    from messenger import Producer

    class P(Producer):
        channel = sys.argv[1]

    producer = P()
    batches = []

    def kill_at_the_second_batch(**_):
        batches.append(1)
        if len(batches) == 2:
            os.kill(os.getpid(), signal.SIGKILL)

    producer.clients.register("before-send.sqs.SendMessageBatch", kill_at_the_second_batch)
    producer.group([{"n": n} for n in range(12)], then={"report": 1}, group_id=sys.argv[2])
    print("finished")
""")


@pytest.mark.timeout(240)
def test_a_producer_killed_between_the_group_record_and_its_members_still_advances(
        settings, clients, producer, consumers, ledger, local_endpoint):
    # Given a consumer running
    consumers.start()
    # When a producer process is killed -9 while pushing a group of 12 members: its first
    # batch (10 members) sent, the other 2 never
    child = subprocess.run(
        [sys.executable, "-c", PRODUCER, workflow_apps.CHANNEL, "g-killed"], cwd=ROOT,
        env={**os.environ, **settings.as_env()}, capture_output=True, text=True, timeout=WAIT)
    assert child.returncode == -signal.SIGKILL and "finished" not in child.stdout
    flows = Workflows(clients, settings)
    group = flows.group("g-killed")
    assert group is not None and not group.sent and len(group.members) == 12
    wait_until(lambda: len(runs(ledger)) == 10, WAIT)  # the 10 sent members run
    # And the sweeper comes by (the 15-minute operations run, past its grace)
    report = flows.sweep(time.time() + SWEEP_GRACE_SECONDS + 1)
    # Then the 2 never sent are failed, and the callback runs once with all 12
    assert report.never_sent == 2
    wait_until(lambda: runs(ledger)["g-killed.then"], WAIT)
    assert dependencies_seen(ledger, "g-killed.then") == [12]
    results = ResultStore(clients, settings)
    for member in ("g-killed.10", "g-killed.11"):
        outcome = results.get(member)
        assert outcome.outcome is Outcome.CANCELLED
        assert outcome.reason == "never sent: the producer stopped"
    # And another sweep finds nothing left to do
    again = flows.sweep(time.time() + SWEEP_GRACE_SECONDS + 1)
    assert (again.looked, again.never_sent) == (0, 0)
    wait_until(lambda: queue_empty(clients, settings), WAIT)
    assert runs(ledger)["g-killed.then"] == 1


@pytest.mark.timeout(300)
def test_50_members_finishing_at_once_on_4_consumers_send_the_callback_once(
        settings, clients, producer, consumers, ledger, tmp_path):
    # Given 4 consumer processes whose members wait for one signal
    go = tmp_path / "go"
    for _ in range(4):
        consumers.start("SlowLeaseMembers", WF_GO=str(go))
    # And a group of 50 members, every one of them received and waiting
    group = producer.group([{"n": n} for n in range(50)], then={"report": 1})
    sqs = clients.client("sqs")
    url = sqs.get_queue_url(QueueName=f"{settings.namespace}-{workflow_apps.CHANNEL}")[
        "QueueUrl"]
    wait_until(lambda: sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])["Attributes"][
        "ApproximateNumberOfMessagesNotVisible"] == "50", WAIT)
    # When they all finish at once
    go.touch()
    # Then the callback runs exactly once, after all 50, with 50 dependencies
    wait_until(lambda: runs(ledger)[group.then_id], WAIT)
    wait_until(lambda: queue_empty(clients, settings), WAIT)
    seen = runs(ledger)
    assert seen[group.then_id] == 1
    assert dependencies_seen(ledger, group.then_id) == [50]
    assert set(group.member_ids) <= set(seen)
    progress = Workflows(clients, settings).group(group.group_id)
    assert progress.finished == 50 and progress.state is State.RELEASED
