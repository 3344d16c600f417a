"""Requeue goes back to the exact queue that dead-lettered, and never says done while the source
still holds messages (in flight after a killed run)."""

from __future__ import annotations

import os
import subprocess
import sys

from messenger import ChannelSpec
from messenger.message import Message
from messenger.operations.requeue import Requeuer
from messenger.provision import Provisioner
from messenger.tools import cli
from messenger.tools.top import requeue_channel
from tests.integration.helpers import decode, drain


def dead_letter(sqs, url, bodies, group=None):
    for body in bodies:
        encoded = Message(body).encode()
        extra = {"MessageGroupId": group} if group else {}
        sqs.send_message(QueueUrl=url, MessageBody=encoded.body,
                         MessageAttributes=encoded.attributes, **extra)


def _exchange(clients, settings):
    provisioner = Provisioner(clients, settings)
    apple = provisioner.ensure_channel(ChannelSpec("shop.apple", namespace=settings.namespace))
    audit = provisioner.ensure_channel(ChannelSpec("shop.audit", namespace=settings.namespace))
    return apple, audit


def test_top_requeues_exchange_queue_to_that_consumer_only(settings, clients):
    # Given two consumers of one exchange and two messages only the apple consumer dead-lettered
    apple, audit = _exchange(clients, settings)
    sqs = clients.client("sqs")
    dead_letter(sqs, apple.dlq.url, [{"n": 1}, {"n": 2}])
    questions = []
    # When the apple channel is requeued by its name
    code = requeue_channel(clients, settings, "shop.apple", lambda q: questions.append(q) or True)
    # Then they are back in the apple queue, and the audit consumer got no second copy
    assert code == 0
    assert "to shop.apple" in questions[0]
    assert sorted(decode(m).body["n"] for m in drain(sqs, apple.queue.url)) == [1, 2]
    assert drain(sqs, audit.queue.url) == []
    assert drain(sqs, apple.dlq.url) == []


def test_requeuer_takes_exchange_queue_as_the_consumers_queue(settings, clients):
    apple, audit = _exchange(clients, settings)
    sqs = clients.client("sqs")
    dead_letter(sqs, apple.dlq.url, [{"n": 1}])
    report = Requeuer(apple.dlq.name, "shop.apple", settings=settings, clients=clients).start()
    assert (report.moved, report.done) == (1, True)
    assert [decode(m).body for m in drain(sqs, apple.queue.url)] == [{"n": 1}]
    assert drain(sqs, audit.queue.url) == []


def test_a_priority_channel_is_requeued_by_its_logical_name(settings, clients):
    # Given a priority channel with a message in each level's DLQ
    spec = ChannelSpec("jobs", priorities=("high", "low"), namespace=settings.namespace)
    provisioner = Provisioner(clients, settings)
    levels = {level.priority_level: provisioner.ensure_channel(level)
              for level in spec.level_specs()}
    sqs = clients.client("sqs")
    dead_letter(sqs, levels["high"].dlq.url, [{"level": "high"}])
    dead_letter(sqs, levels["low"].dlq.url, [{"level": "low"}, {"level": "low"}])
    # When it is requeued as "jobs"
    questions = []
    assert requeue_channel(clients, settings, "jobs", lambda q: questions.append(q) or True) == 0
    # Then each level's messages are back in that level's own queue
    assert "jobs-high" in questions[0] and "jobs-low" in questions[0]
    assert [decode(m).body for m in drain(sqs, levels["high"].queue.url)] == [{"level": "high"}]
    assert [decode(m).body for m in drain(sqs, levels["low"].queue.url)] == [{"level": "low"}] * 2
    assert drain(sqs, levels["high"].dlq.url) == drain(sqs, levels["low"].dlq.url) == []


def test_messages_in_flight_in_the_source_mean_not_done(settings, clients, local_endpoint,
                                                        capsys, monkeypatch):
    # Given a DLQ of 20 where a killed run left 4 hidden for 8 s
    spec = ChannelSpec("orders", namespace=settings.namespace)
    resources = Provisioner(clients, settings).ensure_channel(spec)
    sqs = clients.client("sqs")
    dead_letter(sqs, resources.dlq.url, [{"n": n} for n in range(20)])
    hidden = sqs.receive_message(QueueUrl=resources.dlq.url, MaxNumberOfMessages=4,
                                 VisibilityTimeout=8)["Messages"]
    assert len(hidden) == 4
    # When the requeuer runs without waiting
    report = Requeuer(spec.dlq_name, "orders", settings=settings, clients=clients).start()
    # Then it moved what it could see and says it is not done
    assert (report.moved, report.in_flight, report.done) == (16, 4, False)
    assert "NOT DONE: 4 message(s) still in flight" in report.summary()
    # And the command says so and exits 1 (run in this process: a process costs seconds, and
    # the 4 must still be hidden)
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    capsys.readouterr()
    assert cli.main(["requeue", spec.dlq_name, "orders"]) == 1
    out = capsys.readouterr().out
    assert "moved 0 message(s)" in out and "NOT DONE: 4" in out
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    # When it runs again with --wait
    waited = subprocess.run(
        [sys.executable, "-m", "messenger", "requeue", spec.dlq_name, "orders", "--wait", "40"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    # Then the hidden ones came back and were moved: done, source empty, every message once
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "moved 4 message(s)" in waited.stdout and "NOT DONE" not in waited.stdout
    assert sorted(decode(m).body["n"] for m in drain(sqs, resources.queue.url)) == list(range(20))
    assert drain(sqs, resources.dlq.url) == []


def _requeue_cli(settings, local_endpoint, *args):
    env = {**os.environ, **settings.as_env(), **local_endpoint.env()}
    return subprocess.run([sys.executable, "-m", "messenger", "requeue", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_a_destination_flowing_back_into_the_source_is_refused(settings, clients, local_endpoint):
    # Given a channel's queue holding a message, and an exchange's consumer queue
    orders = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace))
    apple, _ = _exchange(clients, settings)
    sqs = clients.client("sqs")
    dead_letter(sqs, orders.queue.url, [{"n": 1}])
    dead_letter(sqs, apple.queue.url, [{"n": 2}])
    # When the source is the destination's own queue (`-dlq` forgotten), or a queue of the
    # exchange it is requeued to, dry run or not
    runs = [
        _requeue_cli(settings, local_endpoint, "orders", "orders"),
        _requeue_cli(settings, local_endpoint, orders.queue.name, "orders", "--dry-run"),
        _requeue_cli(settings, local_endpoint, apple.queue.name, "shop", "--type", "multi"),
    ]
    # Then each is refused in one line naming the loop, exit 2, and nothing moved
    for run in runs:
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert run.returncode == 2, run.stdout + run.stderr
        assert len(lines) == 1 and "back into the source queue" in lines[0], run.stderr
    assert "did you mean its DLQ" in runs[0].stderr and orders.dlq.name in runs[0].stderr
    assert "exchange 'shop' delivers to it" in runs[2].stderr
    assert [decode(m).body for m in drain(sqs, orders.queue.url)] == [{"n": 1}]
    assert [decode(m).body for m in drain(sqs, apple.queue.url)] == [{"n": 2}]


def test_a_missing_destination_under_auto_provisioning_says_what_to_do(
    settings, clients, local_endpoint
):
    orders = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace))
    run = _requeue_cli(settings, local_endpoint, orders.dlq.name, "ordres")
    assert settings.provisioning == "auto"
    assert run.returncode == 2, run.stdout + run.stderr
    assert "MESSENGER_PROVISIONING=auto" not in run.stderr
    assert "check the name" in run.stderr, run.stderr
