"""push_many killed -9 mid-call, then retried: on an ordered channel the retry returns the same ids
and the queue holds every message exactly once (the ids follow from the content)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from messenger import ChannelSpec, Producer
from messenger.provision import Provisioner
from tests.integration.helpers import decode, drain, queue_url
from tests.reliability.conftest import ROOT, Ledger

SCRIPT = textwrap.dedent("""
    from messenger import Producer, PushItem

    class Ledger(Producer):
        channel = "ledger"
        ordered = True

    Ledger().push_many(PushItem({"order": n}, group_id=f"g{n % 5}") for n in range(300))
    print("finished")
""")


class LedgerProducer(Producer):
    channel = "ledger"
    ordered = True


@pytest.mark.timeout(180)
def test_a_killed_push_many_retried_sends_each_message_once(
    settings, clients, local_endpoint, report
):
    from messenger import PushItem

    items = [PushItem({"order": n}, group_id=f"g{n % 5}") for n in range(300)]
    producer = LedgerProducer(settings=settings, clients=clients)
    Provisioner(clients, settings).ensure_channel(
        ChannelSpec("ledger", ordered=True, namespace=settings.namespace))
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-ledger.fifo")

    def depth() -> int:
        return int(sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"])

    # Given a process whose push_many of 300 messages is killed -9 after about 80 went out
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    child = subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, text=True)
    while child.poll() is None and depth() < 80:
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    output, _ = child.communicate(timeout=10)
    sent_before = depth()
    assert child.returncode == -signal.SIGKILL and "finished" not in output
    assert 0 < sent_before < 300
    # When the caller retries the whole call
    retry = producer.push_many(items)
    # Then nothing failed, and the queue holds each message once, under the id the retry returned
    assert not retry.failures
    received = drain(sqs, url)
    ids = [decode(raw).message_id for raw in received]
    by_id = {decode(raw).message_id: decode(raw).body["order"] for raw in received}
    copies = Counter(ids)
    ledger = Ledger(acknowledged=list(retry.message_ids), in_queue=ids)
    line = ledger.report("push_many_kill_9", sent_before_kill=sent_before,
                         extra_copies=len(ids) - len(copies))
    report(line)
    assert ledger.lost == set() and max(copies.values()) == 1, line
    assert len(ids) == 300
    assert [by_id[i] for i in retry.message_ids] == list(range(300))
