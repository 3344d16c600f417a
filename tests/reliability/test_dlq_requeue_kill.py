"""`messenger dlq requeue` killed -9 while it scans and while it moves: no dead letter is lost,
only the named ones ever reach the queue, and a rerun finishes the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from messenger import ChannelSpec
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE, Message
from messenger.provision import Provisioner
from tests.integration.helpers import decode, drain
from tests.reliability.conftest import ROOT

TOTAL, CHOSEN = 200, 40


def _count(sqs, url, attribute="ApproximateNumberOfMessages"):
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[attribute])["Attributes"]
    return int(attributes.get(attribute, 0))


@pytest.mark.timeout(240)
def test_killed_dlq_requeue_loses_nothing_and_moves_only_the_named(
    settings, clients, local_endpoint
):
    # Given a DLQ of 200 dead letters, 40 of which are to be requeued
    spec = ChannelSpec("orders", namespace=settings.namespace)
    resources = Provisioner(clients, settings).ensure_channel(spec)
    sqs = clients.client("sqs")
    ids = [f"job-{n:03d}" for n in range(TOTAL)]
    for first in range(0, TOTAL, 10):
        entries = []
        for offset, message_id in enumerate(ids[first : first + 10]):
            encoded = Message({"id": message_id}, message_id=message_id).encode()
            attributes = {**encoded.attributes, DEAD_LETTER_REASON_ATTRIBUTE: {
                "DataType": "String", "StringValue": "handler failed"}}
            entries.append({"Id": str(offset), "MessageBody": encoded.body,
                            "MessageAttributes": attributes})
        assert not sqs.send_message_batch(QueueUrl=resources.dlq.url, Entries=entries).get(
            "Failed")
    chosen = ids[::5]
    assert len(chosen) == CHOSEN
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    command = [sys.executable, "-m", "messenger", "dlq", "requeue", "orders", *chosen,
               "--visibility-timeout", "3"]
    # When one run is killed -9 while it scans (messages held) and one while it moves
    for moment in ("scanning", "moving"):
        child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        while child.poll() is None:
            held = _count(sqs, resources.dlq.url, "ApproximateNumberOfMessagesNotVisible")
            moved = _count(sqs, resources.queue.url)
            if (moment == "scanning" and held > 0) or (moment == "moving" and moved > 0):
                break
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        # (what it held comes back after its 3 s visibility timeout)
        deadline = time.monotonic() + 30
        while _count(sqs, resources.dlq.url, "ApproximateNumberOfMessagesNotVisible") and \
                time.monotonic() < deadline:
            time.sleep(0.2)
    # Then nothing is lost and only chosen letters reached the queue
    in_queue = [decode(m).message_id for m in drain(sqs, resources.queue.url)]
    assert set(in_queue) <= set(chosen)
    # And a rerun for the chosen ones still in the DLQ (requeue refuses unknown ids) finishes
    remaining = [message_id for message_id in chosen if message_id not in set(in_queue)]
    if remaining:
        rerun = subprocess.run([*command[:6], *remaining], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stdout + rerun.stderr
        in_queue += [decode(m).message_id for m in drain(sqs, resources.queue.url)]
    in_dlq = [decode(m).message_id for m in drain(sqs, resources.dlq.url)]
    assert set(in_queue) == set(chosen)
    # A chosen letter may be both moved and still in the DLQ (killed between the send and the
    # delete: a duplicate, never a loss); every other letter is in the DLQ exactly once
    assert sorted(m for m in in_dlq if m not in set(chosen)) == \
        sorted(set(ids) - set(chosen))
    assert set(in_queue) | set(in_dlq) == set(ids)
