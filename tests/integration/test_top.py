"""`messenger top`: rows from queue attributes and CloudWatch, JSON, requeue with a prompt."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from messenger import ChannelSpec, ChannelTags, MessageFilter, Producer
from messenger.operations.snapshot import snapshot
from messenger.provision import Provisioner
from messenger.tools import cli
from messenger.tools.top import requeue_channel


def make_channels(clients, settings):
    provisioner = Provisioner(clients, settings)
    orders = provisioner.ensure_channel(ChannelSpec(
        "orders", namespace=settings.namespace, tags=ChannelTags(critical=True)))
    audit = provisioner.ensure_channel(ChannelSpec(
        "shop.audit", namespace=settings.namespace, message_filter=MessageFilter("exact", ["A"])))
    return orders, audit


def test_snapshot_lists_depths_dlq_rates_and_critical_first(settings, clients):
    orders, audit = make_channels(clients, settings)
    sqs = clients.client("sqs")

    class Orders(Producer):
        channel = "orders"

    Orders(settings=settings, clients=clients).push_many([{"n": n} for n in range(3)])
    sqs.send_message(QueueUrl=orders.dlq.url, MessageBody="{}")
    sqs.send_message(QueueUrl=audit.queue.url, MessageBody="{}", DelaySeconds=60)
    # CloudWatch: seeded, as moto emits no SQS metrics. The datapoints are half a minute old:
    # moto truncates the query's end to the second, so one from this very second is left out.
    recent = datetime.now(UTC) - timedelta(seconds=30)
    clients.client("cloudwatch").put_metric_data(Namespace="AWS/SQS", MetricData=[
        {"MetricName": "NumberOfMessagesSent", "Value": 50, "Timestamp": recent,
         "Dimensions": [{"Name": "QueueName", "Value": orders.queue.name}]},
        {"MetricName": "NumberOfMessagesReceived", "Value": 5, "Timestamp": recent,
         "Dimensions": [{"Name": "QueueName", "Value": orders.queue.name}]},
    ])
    rows = snapshot(clients, settings)
    assert [r.queue for r in rows] == [orders.queue.name, audit.queue.name]
    first, second = rows
    assert (first.visible, first.dlq_depth, first.critical) == (3, 1, True)
    assert (first.in_per_minute, first.consumers_active) == (10.0, True)
    assert (second.delayed, second.channel, second.consumers_active) == (1, "shop.audit", None)


def test_cli_once_json_and_requeue_with_confirmation(settings, clients, local_endpoint, capsys,
                                                     monkeypatch):
    orders, _ = make_channels(clients, settings)
    sqs = clients.client("sqs")
    sqs.send_message(QueueUrl=orders.dlq.url, MessageBody='{"n": 1}')
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace,
           "COLUMNS": "200"}

    def messenger(*args, stdin=""):
        return subprocess.run([sys.executable, "-m", "messenger", *args], env=env, input=stdin,
                              capture_output=True, text=True, timeout=60)

    def in_terminal(*args, answer):
        """Run with a pseudo-terminal as stdin (a person at the prompt) answering `answer`."""
        controller, terminal = pty.openpty()
        os.write(controller, answer.encode())
        try:
            return subprocess.run([sys.executable, "-m", "messenger", *args], env=env,
                                  stdin=terminal, capture_output=True, text=True, timeout=60)
        finally:
            os.close(controller)
            os.close(terminal)

    once = messenger("top", "--once")
    assert once.returncode == 0, once.stderr
    assert "!orders" in once.stdout  # critical first, marked
    # (the calls that need no process of their own run in this one: a process costs seconds)
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()
    assert cli.main(["top", "--once"]) == 0
    narrow = capsys.readouterr().out
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert "shop.audit" in narrow and "work" in narrow
    assert cli.main(["top", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["queue"]: r["dlq_depth"] for r in rows}[orders.queue.name] == 1
    assert {r["queue"]: r["workers"] for r in rows}[orders.queue.name] == 0
    # Without a terminal to ask, --requeue needs --yes: one line, exit 2, nothing moved
    piped = messenger("top", "--requeue", "orders", stdin="y\n")
    assert piped.returncode == 2 and piped.stderr.strip().count("\n") == 0, piped.stderr
    assert "needs --yes" in piped.stderr
    declined = in_terminal("top", "--requeue", "orders", answer="n\n")
    assert declined.returncode == 1 and "nothing moved" in declined.stdout
    accepted = in_terminal("top", "--requeue", "orders", answer="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert f"moved 1 message(s) from {orders.dlq.name}" in accepted.stdout
    assert cli.main(["top", "--requeue", "orders", "--yes"]) == 0  # now empty
    assert requeue_channel(clients, settings, "orders", lambda question: True) == 0
