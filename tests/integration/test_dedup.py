"""Dedup on enqueue: a repeated message id within the window is not sent and is reported; two
processes racing on one id send one message; ordered channels report SQS's own drops. Never a
duplicate unsent: a claim whose answer was lost is the producer's own, and a claim left by a
failed send whose release failed too is taken over (at once from the same process, after the
lease from any other)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from messenger import Producer, PushItem
from messenger.errors import InvalidMessage, InvalidSettings, PublishFailed
from messenger.jobs.dedup import HELD_CODE, RecentIds
from tests.faults import injected
from tests.integration.helpers import decode, drain

ROOT = Path(__file__).resolve().parents[2]


class Jobs(Producer):
    channel = "jobs"
    dedup = True


class Plain(Producer):
    channel = "jobs"


class Ledger(Producer):
    channel = "ledger"
    ordered = True


def queue(clients, settings, name="jobs"):
    sqs = clients.client("sqs")
    return sqs, sqs.get_queue_url(QueueName=f"{settings.namespace}-{name}")["QueueUrl"]


def test_a_repeated_id_is_reported_and_not_sent(settings, clients):
    producer = Jobs(settings=settings, clients=clients)
    first = producer.push({"n": 1}, message_id="job-1")
    again = producer.push({"n": 2}, message_id="job-1")
    assert (first, first.duplicate) == ("job-1", False)
    assert (again, again.duplicate) == ("job-1", True)
    # push_many: a repeat of an earlier push and a repeat inside the call are duplicates
    result = producer.push_many([PushItem({"n": 3}, message_id="job-2"),
                                 PushItem({"n": 4}, message_id="job-1"),
                                 PushItem({"n": 5}, message_id="job-2"),
                                 PushItem({"n": 6})])  # no id: nothing to repeat
    assert result.duplicates == [1, 2] and result.published == 2 and not result.failures
    assert result.message_ids[:3] == ["job-2", "job-1", "job-2"]
    sqs, url = queue(clients, settings)
    assert sorted(decode(m).body["n"] for m in drain(sqs, url)) == [1, 3, 6]


def test_per_push_switch_and_the_window(settings, clients):
    producer = Plain(settings=settings, clients=clients)
    # Off by default: the same id twice is two messages
    assert not producer.push({"n": 1}, message_id="a").duplicate
    assert not producer.push({"n": 2}, message_id="a").duplicate
    # On for one push: a claim is made; a later dedup push of that id is a duplicate
    assert not producer.push({"n": 3}, message_id="b", dedup=True).duplicate
    assert producer.push({"n": 4}, message_id="b", dedup=True).duplicate
    # A claim past its window (TTL deletes lazily: the condition checks expires_at itself)
    clients.client("dynamodb").update_item(
        TableName=producer.dedup_store.table, Key={"dedup_key": {"S": "jobs#b"}},
        UpdateExpression="SET expires_at = :past",
        ExpressionAttributeValues={":past": {"N": str(int(time.time()) - 1)}})
    assert not producer.push({"n": 5}, message_id="b", dedup=True).duplicate
    sqs, url = queue(clients, settings)
    assert sorted(decode(m).body["n"] for m in drain(sqs, url)) == [1, 2, 3, 5]


def test_a_failed_send_releases_its_claim(settings, clients):
    producer = Jobs(settings=settings.with_changes(retry_budget_seconds=0.5), clients=clients)
    producer.push({"warm": True})  # the queue exists

    def refuse(params=None, model=None, **_):
        if model is not None and model.name in ("SendMessage", "SendMessageBatch"):
            from botocore.exceptions import EndpointConnectionError
            raise EndpointConnectionError(endpoint_url="http://blackholed")

    with injected(clients, "before-call", refuse), pytest.raises(PublishFailed):
        producer.push({"n": 1}, message_id="job-9")
    with injected(clients, "before-call", refuse):
        result = producer.push_many([PushItem({"n": 2}, message_id="job-10")])
    assert result.failures and not result.duplicates
    # Then the retries are not duplicates: both are sent
    assert not producer.push({"n": 1}, message_id="job-9").duplicate
    assert producer.push_many([PushItem({"n": 2}, message_id="job-10")]).published == 1


class LostFirstAnswer:
    """botocore `after-call` hook: the first answer of `operation` is lost after DynamoDB
    applied the request (a read timeout), as a timeout or a 5xx after the write would."""

    def __init__(self, operation: str = "PutItem") -> None:
        self.operation, self.lost = operation, 0

    def __call__(self, model=None, **_):
        if model is not None and model.name == self.operation and not self.lost:
            self.lost += 1
            raise ReadTimeoutError(endpoint_url="http://dynamodb (answer lost)")


def refuse(*operations):
    """botocore `before-call` hook: the operations fail like a dropped connection."""
    def hook(model=None, **_):
        if model is not None and model.name in operations:
            raise EndpointConnectionError(endpoint_url="http://blackholed")
    return hook


@pytest.mark.parametrize("many", [False, True], ids=["push", "push_many"])
def test_a_claim_whose_answer_was_lost_is_sent_once(settings, clients, many):
    producer = Jobs(settings=settings, clients=clients)
    producer.push({"warm": True})  # the queue and the table exist
    sqs, url = queue(clients, settings)
    drain(sqs, url)
    # Given DynamoDB stores the claim but its answer is lost (the retry finds the claim there)
    fault = LostFirstAnswer()
    with injected(clients, "after-call", fault):
        # When the job is pushed
        if many:
            result = producer.push_many([PushItem({"n": 1}, message_id="lost-1"),
                                         PushItem({"n": 2}, message_id="lost-2")])
            assert (result.published, result.duplicates, result.failures) == (2, [], [])
        else:
            assert not producer.push({"n": 1}, message_id="lost-1").duplicate
    assert fault.lost == 1
    # Then it was sent exactly once, and a later push of the id is the duplicate
    assert sorted(decode(m).message_id for m in drain(sqs, url)) == \
        ["lost-1", "lost-2"][:1 + many]
    assert producer.push({"n": 3}, message_id="lost-1").duplicate


class Leased(Producer):
    channel = "jobs"
    dedup = True
    dedup_lease = 2.0


def test_a_failed_send_whose_release_failed_is_sent_by_a_retry(settings, clients):
    short = settings.with_changes(retry_budget_seconds=0.3)
    producer = Leased(settings=short, clients=clients)
    producer.push({"warm": True})
    sqs, url = queue(clients, settings)
    drain(sqs, url)
    # Given sends fail past the budget and so do the releases of their claims
    with injected(clients, "before-call", refuse("SendMessage", "SendMessageBatch",
                                                  "DeleteItem")):
        with pytest.raises(PublishFailed):
            producer.push({"n": 1}, message_id="r-1")
        result = producer.push_many([PushItem({"n": 2}, message_id="r-2")])
        assert result.failures and not result.duplicates
        with pytest.raises(PublishFailed):
            producer.push({"n": 3}, message_id="r-3")
    # When another producer (its own tokens) pushes r-1 within the lease: neither sent nor a
    # duplicate, it fails clearly (the id is another producer's, not yet sent)
    other = Leased(settings=short, clients=clients)
    with pytest.raises(PublishFailed, match="being pushed by another producer"):
        other.push({"n": 1}, message_id="r-1")
    held = other.push_many([PushItem({"n": 2}, message_id="r-2")])
    assert [f.code for f in held.failures] == [HELD_CODE] and not held.duplicates
    # Then the same producer's retry sends at once (its own claim), the other's after the lease
    started = time.monotonic()
    assert not producer.push({"n": 3}, message_id="r-3").duplicate
    assert producer.push_many([PushItem({"n": 2}, message_id="r-2")]).published == 1
    assert time.monotonic() - started < Leased.dedup_lease
    time.sleep(Leased.dedup_lease)
    assert not other.push({"n": 1}, message_id="r-1").duplicate
    # and each job was sent exactly once: now every id is a duplicate
    assert sorted(decode(m).body["n"] for m in drain(sqs, url)) == [1, 2, 3]
    assert all(other.push({}, message_id=f"r-{n}").duplicate for n in (1, 2, 3))


def test_claims_of_the_older_schema_stay_duplicates(settings, clients):
    producer = Jobs(settings=settings, clients=clients)
    producer.push({"warm": True}, message_id="warm")  # the table exists
    # Given a claim written before leases (no state, no lease): its producer's send is unknown
    now = int(time.time())
    clients.client("dynamodb").put_item(TableName=producer.dedup_store.table, Item={
        "dedup_key": {"S": "jobs#old"}, "message_id": {"S": "old"}, "channel": {"S": "jobs"},
        "claimed_at": {"N": str(now)}, "token": {"S": "t0"}, "expires_at": {"N": str(now + 60)}})
    # Then a push of its id is a duplicate within its window, as before
    assert producer.push({"n": 1}, message_id="old").duplicate


def test_bad_dedup_settings_get_one_clear_error(settings, clients):
    class Window(Producer):
        channel = "jobs"
        dedup = True
        dedup_window = 0

    with pytest.raises(InvalidSettings, match="dedup_window must be a whole number of seconds"):
        Window(settings=settings, clients=clients)

    class Lease(Producer):
        channel = "jobs"
        dedup_lease = 0

    with pytest.raises(InvalidSettings, match="dedup_lease must be a number of seconds > 0"):
        Lease(settings=settings, clients=clients)
    with pytest.raises(InvalidMessage, match="dedup must be True, False or None"):
        Plain(settings=settings, clients=clients).push({"n": 1}, message_id="x", dedup="yes")


def test_ordered_channel_reports_what_sqs_would_drop(settings, clients):
    producer = Ledger(settings=settings, clients=clients)
    first = producer.push({"n": 1}, dedup_id="d1")
    # The same deduplication id with other content: SQS drops it; the producer says so
    again = producer.push({"n": 2}, dedup_id="d1")
    assert not first.duplicate and again.duplicate and first == again
    result = producer.push_many([PushItem({"n": 3}, dedup_id="d2"),
                                 PushItem({"n": 4}, dedup_id="d2"),
                                 PushItem({"n": 5}, dedup_id="d1")])
    assert (result.published, result.duplicates) == (1, [1, 2])
    sqs, url = queue(clients, settings, "ledger.fifo")
    assert [decode(m).body["n"] for m in drain(sqs, url)] == [1, 3]


def test_recent_ids_forget_after_sqs_interval():
    recent = RecentIds(interval=300, capacity=2)
    recent.add(["a"], now=0)
    assert recent.seen("a", now=299) and not recent.seen("a", now=300)
    recent.add(["b", "c"], now=10)
    assert not recent.seen("a", now=11)  # over capacity: the oldest goes


RACER = """
import json, sys
from messenger import Producer, PushItem
from messenger.jobs.dedup import HELD_CODE
class Jobs(Producer):
    channel = "jobs"
    dedup = True
producer = Jobs()
items = [PushItem({"n": n}, message_id=f"race-{n}") for n in range(30)]
print("ready", flush=True)
sys.stdin.readline()  # the go: every racer is past its imports and waiting
published, held = 0, 0
while items:
    result = producer.push_many(items)
    published += result.published
    # Only an id another racer holds may fail (it waited its retry budget for that claim to be
    # marked sent): not sent, retry it, as a producer would (a sent one is then a duplicate)
    assert all(failure.code == HELD_CODE for failure in result.failures), result.failures
    held += len(result.failures)
    items = [items[failure.index] for failure in result.failures]
print(json.dumps({"published": published, "held": held}))
"""


@pytest.mark.timeout(300)  # a hang: the racers start together on a signal, not at a time
def test_racing_processes_send_each_id_once(settings, clients, local_endpoint):
    # Given the table and queue exist (so both processes race on the claims, not on setup)
    Jobs(settings=settings, clients=clients).push({"warm": True}, message_id="warm")
    sqs, url = queue(clients, settings)
    drain(sqs, url)
    env = {**os.environ, **local_endpoint.env(), **settings.as_env()}
    racers = [subprocess.Popen([sys.executable, "-c", RACER], cwd=ROOT, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
              for _ in range(3)]
    # When three processes, each ready, push the same 30 ids at the same moment
    for racer in racers:
        assert racer.stdout is not None and racer.stdout.readline() == "ready\n", \
            racer.communicate()
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    outputs = [racer.communicate(timeout=240) for racer in racers]
    assert all(racer.returncode == 0 for racer in racers), outputs
    # Then each id was sent exactly once, and the reports add up to that
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sum(report["published"] for report in reports) == 30, reports
    got = sorted(decode(m).message_id for m in drain(sqs, url))
    assert got == sorted(f"race-{n}" for n in range(30))
