"""Operations act exactly on what they are told: a channel's own queues (never another channel's
that shares its name's prefix), one dead letter per id (never every copy of a message id), and a
body that is not UTF-8 is shown, not a traceback (issue 40, items 2 and 5)."""

from __future__ import annotations

import re

import pytest
import requests

from messenger import ChannelSpec, Message
from messenger.jobs.workers import WorkerRegistry
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE
from messenger.offload import PayloadStore, pointer_attributes
from messenger.operations.deadletters import (
    NOT_UTF8,
    AmbiguousDeadLetter,
    DeadLetterWorkbench,
)
from messenger.operations.snapshot import channel_dlq_rows, snapshot
from messenger.provision import Provisioner
from messenger.tools import cli
from messenger.tools.top import requeue_channel
from tests.integration.helpers import decode, drain
from tests.integration.test_dlq_workbench import channel, counts, dead_letter


def side_by_side(settings, clients):
    """Channels 'jobs' (levels high, low) and 'jobs-eu', a dead letter in each DLQ."""
    provisioner = Provisioner(clients, settings)
    jobs = provisioner.ensure_channel(ChannelSpec("jobs", priorities=("high", "low"),
                                                  namespace=settings.namespace))
    eu = provisioner.ensure_channel(ChannelSpec("jobs-eu", namespace=settings.namespace))
    sqs = clients.client("sqs")
    high, low = jobs.levels
    dead_letter(sqs, high.dlq.url, Message({"n": 1}, message_id="urgent"))
    dead_letter(sqs, low.dlq.url, Message({"n": 2}, message_id="later"))
    dead_letter(sqs, eu.dlq.url, Message({"n": 3}, message_id="eu-job"))
    return high, low, eu


def register(clients, settings, channel_name):
    registry = WorkerRegistry(clients, settings.with_changes(provisioning="auto"), channel_name,
                              "app.Consumer", environ={})
    registry.start("LISTENING")
    return registry


def test_top_rows_and_worker_counts_belong_to_their_own_channel(settings, clients):
    # Given 'jobs' (two levels) and 'jobs-eu', a worker of 'jobs' and two of 'jobs-eu'
    high, low, eu = side_by_side(settings, clients)
    for name in ("jobs", "jobs-eu", "jobs-eu"):
        register(clients, settings, name)
    # When the snapshot is taken
    rows = {r.queue: r for r in snapshot(clients, settings)}
    # Then each level's row is the channel 'jobs' at its level, and 'jobs-eu' is its own
    assert (rows[high.queue.name].channel, rows[high.queue.name].level) == ("jobs", "high")
    assert (rows[low.queue.name].channel, rows[low.queue.name].level) == ("jobs", "low")
    assert (rows[eu.queue.name].channel, rows[eu.queue.name].level) == ("jobs-eu", None)
    # And workers count on their own channel's rows only
    assert [rows[q.queue.name].workers for q in (high, low, eu)] == [1, 1, 2]
    # And the rows of 'jobs' with a DLQ are its two levels' only
    assert sorted(r.dlq for r in channel_dlq_rows(clients, settings, "jobs")) == sorted(
        [high.dlq.name, low.dlq.name])


def test_requeue_all_and_the_workbench_touch_only_their_channel(settings, clients, monkeypatch,
                                                                 capsys):
    high, low, eu = side_by_side(settings, clients)
    sqs = clients.client("sqs")
    # The workbench of 'jobs' reads its levels' DLQs, not 'jobs-eu''s
    bench = DeadLetterWorkbench("jobs", settings, clients)
    assert sorted(bench.dlqs) == sorted([high.dlq.name, low.dlq.name])
    assert sorted(x.id for x in bench.list().letters) == ["later", "urgent"]
    # `messenger dlq list jobs` neither
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    assert cli.main(["dlq", "list", "jobs"]) == 0
    assert "eu-job" not in capsys.readouterr().out
    # When the whole DLQ of 'jobs' is requeued (`messenger top --requeue jobs`)
    assert requeue_channel(clients, settings, "jobs", lambda question: True) == 0
    # Then each level's letter is back in its level's queue, and 'jobs-eu''s stays dead
    assert [decode(m).message_id for m in drain(sqs, high.queue.url)] == ["urgent"]
    assert [decode(m).message_id for m in drain(sqs, low.queue.url)] == ["later"]
    assert counts(sqs, eu.dlq.url) == (1, 0)
    assert drain(sqs, eu.queue.url) == []


def twins(settings, clients):
    """Channel 'orders' whose DLQ holds two letters carrying the message id 'job-1', and
    'job-2' once; returns (resources, the twins' SQS MessageIds)."""
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    for n in (1, 1, 2):
        dead_letter(sqs, resources.dlq.url, Message({"n": n}, message_id=f"job-{n}"))
    letters = DeadLetterWorkbench("orders", settings, clients).list().letters
    return resources, sorted(x.sqs_message_id for x in letters if x.id == "job-1")


def test_one_letter_of_two_with_the_same_message_id_is_requeued_alone(settings, clients):
    resources, (first, second) = twins(settings, clients)
    sqs = clients.client("sqs")
    bench = DeadLetterWorkbench("orders", settings, clients)
    # The shared message id names no letter: nothing moves, and the error names both MessageIds
    with pytest.raises(AmbiguousDeadLetter, match=f"{first}.*{second}"):
        bench.requeue(["job-1"])
    with pytest.raises(AmbiguousDeadLetter):
        bench.delete(["job-1"])
    assert counts(sqs, resources.dlq.url) == (3, 0)
    # One MessageId moves that letter only (the job runs once)
    [report] = bench.requeue([first])
    assert report.moved == 1
    assert [m["Body"] for m in drain(sqs, resources.queue.url)] == [
        Message({"n": 1}).encode().body]
    assert counts(sqs, resources.dlq.url) == (2, 0)
    # Now the message id names one letter: it is acted on, exactly
    assert bench.delete(["job-1"]) == 1
    assert [decode(m).message_id for m in drain(sqs, resources.dlq.url)] == ["job-2"]


def test_cli_says_which_letters_an_ambiguous_id_names(settings, clients, monkeypatch, capsys):
    resources, (first, second) = twins(settings, clients)
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    # `dlq list` prints the ids `dlq show` takes: the twins by their MessageIds, uncut
    assert cli.main(["dlq", "list", "orders"]) == 0
    listed = capsys.readouterr().out
    assert first in listed and second in listed and "job-2" in listed
    # Naming the shared id: exit 2, one line listing both MessageIds, nothing changed
    for argv in (["dlq", "requeue", "orders", "job-1"], ["dlq", "show", "orders", "job-1"],
                 ["dlq", "delete", "orders", "job-1", "--yes"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and first in err and second in err, err
    assert counts(clients.client("sqs"), resources.dlq.url) == (3, 0)
    # A MessageId from the listing works as pasted
    assert cli.main(["dlq", "show", "orders", second]) == 0
    assert f"sqs message id:      {second}" in capsys.readouterr().out


def offloaded_letter(settings, clients, data: bytes, message_id="job-bin"):
    resources = channel(settings, clients)
    provisioner = Provisioner(clients, settings)
    store = PayloadStore(clients.client("s3"), provisioner.ensure_bucket(), provisioner.key_arn())
    pointer = store.put(data)
    attributes = {**Message({}, message_id=message_id).encode().attributes,
                  **pointer_attributes(len(data)),
                  DEAD_LETTER_REASON_ATTRIBUTE: {"DataType": "String", "StringValue": "failed"}}
    clients.client("sqs").send_message(QueueUrl=resources.dlq.url, MessageBody=pointer.encode(),
                                       MessageAttributes=attributes)
    return resources


def test_an_offloaded_body_that_is_not_utf8_is_shown_with_its_bytes(settings, clients,
                                                                    monkeypatch, capsys):
    # Given a dead letter whose offloaded body is not UTF-8
    data = b'{"price": "\xff\xfe 12"}'
    resources = offloaded_letter(settings, clients, data)
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    # When it is shown
    code = cli.main(["dlq", "show", "orders", "job-bin"])
    out, err = capsys.readouterr()
    # Then the letter is shown, its body with the bytes escaped after one line saying so
    assert code == 0 and "Traceback" not in out + err, err
    assert NOT_UTF8.format(size=len(data)) in out
    assert '{"price": "\\xff\\xfe 12"}' in out
    assert counts(clients.client("sqs"), resources.dlq.url) == (1, 0)


# -- the dashboard -----------------------------------------------------------------------------
def _served(settings, clients):
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from tests.dashboard import served

    return served(settings, clients)


def _post(dash, path, **form):
    return requests.post(dash.url + path, data={"token": dash.token, **form},
                         headers={"Host": f"127.0.0.1:{dash.port}"}, timeout=30)


def _get(dash, path):
    return requests.get(dash.url + path, headers={"Host": f"127.0.0.1:{dash.port}"}, timeout=30)


def test_dashboard_requeues_only_its_channel_and_counts_its_workers(settings, clients):
    high, low, eu = side_by_side(settings, clients)
    register(clients, settings, "jobs-eu")
    sqs = clients.client("sqs")
    with _served(settings, clients) as dash:
        page = _get(dash, "/channels/jobs")
        # The page of 'jobs' lists its letters and workers, not 'jobs-eu''s
        assert page.status_code == 200
        assert "urgent" in page.text and "later" in page.text and "eu-job" not in page.text
        assert "no workers registered" in page.text
        # 'Requeue the whole DLQ' asks about the levels of 'jobs' only, then moves those only
        asked = _post(dash, "/channels/jobs/requeue-all")
        assert asked.status_code == 200 and eu.dlq.name not in asked.text
        done = _post(dash, "/channels/jobs/requeue-all", confirmed="yes")
        assert done.status_code == 200
    assert [decode(m).message_id for m in drain(sqs, high.queue.url)] == ["urgent"]
    assert [decode(m).message_id for m in drain(sqs, low.queue.url)] == ["later"]
    assert counts(sqs, eu.dlq.url) == (1, 0)


def test_dashboard_shows_twins_as_two_letters_and_deletes_one(settings, clients):
    resources, (first, second) = twins(settings, clients)
    with _served(settings, clients) as dash:
        page = _get(dash, "/channels/orders").text
        # Two rows, each ticked by its own MessageId
        values = re.findall(r'name="ids" value="([^"]+)"', page)
        assert first in values and second in values and len(values) == 3
        # The shared id names no single letter: a clear 400 naming both, nothing changed
        refused = _post(dash, "/channels/orders/delete", ids="job-1", confirmed="yes")
        assert refused.status_code == 400
        assert first in refused.text and second in refused.text
        assert counts(clients.client("sqs"), resources.dlq.url) == (3, 0)
        # Ticking one deletes exactly one
        done = _post(dash, "/channels/orders/delete", ids=first, confirmed="yes")
        assert done.status_code == 200
    left = drain(clients.client("sqs"), resources.dlq.url)
    assert sorted(m["MessageId"] for m in left if decode(m).message_id == "job-1") == [second]
    assert len(left) == 2


def test_dashboard_shows_a_letter_whose_body_is_not_utf8(settings, clients):
    offloaded_letter(settings, clients, b"\x80binary\xff")
    with _served(settings, clients) as dash:
        page = _get(dash, "/channels/orders/letters/job-bin")
    assert page.status_code == 200
    assert "\\x80binary\\xff" in page.text and "not UTF-8" in page.text
