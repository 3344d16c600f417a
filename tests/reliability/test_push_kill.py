"""push_many killed -9 mid-call, then retried: on an ordered channel the retry returns the same ids
and the queue holds every message exactly once (the ids follow from the content). A dedup push
killed -9 between its claim and its send: a retry of the id sends it after the claim's lease."""

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


CLAIMER = textwrap.dedent("""
    import time
    from messenger import Producer

    class Jobs(Producer):
        channel = "jobs"
        dedup = True
        dedup_lease = float(__import__("sys").argv[1])

    producer = Jobs()
    claim = producer.dedup_store.claim

    def claim_then_stop(*args, **kwargs):  # paused between the claim and the send
        verdict = claim(*args, **kwargs)
        print("claimed", flush=True)
        time.sleep(600)
        return verdict

    producer.dedup_store.claim = claim_then_stop
    producer.push({"job": 7}, message_id="job-7")
    print("finished")
""")


class DedupJobs(Producer):
    channel = "jobs"
    dedup = True
    dedup_lease = 3.0


@pytest.mark.timeout(120)
def test_a_dedup_push_killed_between_claim_and_send_is_sent_by_a_retry_after_the_lease(
    settings, clients, local_endpoint, report
):
    from messenger.errors import PublishFailed

    DedupJobs(settings=settings, clients=clients).push({"warm": True}, message_id="warm")
    sqs = clients.client("sqs")
    url = queue_url(sqs, f"{settings.namespace}-jobs")
    drain(sqs, url)
    # Given a producer process killed -9 after its claim of job-7 and before its send
    env = {**os.environ, **local_endpoint.env(), **settings.as_env()}
    child = subprocess.Popen([sys.executable, "-c", CLAIMER, str(DedupJobs.dedup_lease)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "claimed"
    killed_at = time.monotonic()
    child.send_signal(signal.SIGKILL)
    output, _ = child.communicate(timeout=10)
    assert child.returncode == -signal.SIGKILL and "finished" not in output
    # When the caller retries at once, with a budget shorter than the lease: neither sent nor a
    # duplicate; it fails, saying the id is held
    impatient = DedupJobs(settings=settings.with_changes(retry_budget_seconds=0.5),
                          clients=clients)
    with pytest.raises(PublishFailed, match="being pushed by another producer"):
        impatient.push({"job": 7}, message_id="job-7")
    # and again with a budget that outlasts the lease: it waits the lease out and sends
    retry = DedupJobs(settings=settings, clients=clients).push({"job": 7}, message_id="job-7")
    waited = time.monotonic() - killed_at
    # Then the job is in the queue exactly once, sent after the lease, and now a duplicate
    received = [decode(raw) for raw in drain(sqs, url)]
    line = {"test": "dedup_push_kill_9", "lease_seconds": DedupJobs.dedup_lease,
            "sent_after_seconds": round(waited, 2), "copies": len(received)}
    report(line)
    assert not retry.duplicate and [m.message_id for m in received] == ["job-7"], line
    assert waited >= DedupJobs.dedup_lease
    assert impatient.push({"job": 7}, message_id="job-7").duplicate
