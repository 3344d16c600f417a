"""Dashboard fixes over HTTP against the local endpoint (issue 50 items 11, 13, 20): an action
names at most 100 ids (101: a 400, nothing changed; a filter preview ticks the first 100);
`cancel-job` under a channel that does not exist is a 404; a prioritized channel's levels are
read at once on its page; a viewer sees no tick boxes; a cancel's text is shown as its reason,
not as an error."""

from __future__ import annotations

import re
import threading

import pytest
import requests

from messenger import Message
from messenger.jobs.controls import TAG_PAUSED
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.operations.deadletters import DeadLetterWorkbench
from messenger.operations.pause import pause, resume
from tests.dashboard import ALB_ARN, CLIENT_ID, alb_key_server, served
from tests.faults import injected
from tests.integration.test_dlq_workbench import channel, dead_letter

pytest.importorskip("jwt", reason="the dashboard extra is not installed")

from messenger.tools.dashboard.auth import AlbIdentity  # noqa: E402

VIEWER = {"sub": "u-2", "email": "bob@example.com", "custom:groups": "readers"}


def post(dash, path, **form):
    return requests.post(dash.url + path, data={"token": dash.token, **form}, timeout=60)


def test_an_action_names_at_most_100_ids(settings, clients):
    # Given 'orders' with 102 dead letters
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    for n in range(102):
        dead_letter(sqs, resources.dlq.url, Message({"n": n}, message_id=f"job-{n}"))
    letters = DeadLetterWorkbench("orders", settings, clients).list().letters
    ids = [x.sqs_message_id for x in letters]
    assert len(ids) == 102
    with served(settings, clients) as dash:
        # When an action names 101 of them: 400 naming the limit, nothing deleted
        for action in ("delete", "requeue", "cancel-scheduled", "cancel-job"):
            response = post(dash, f"/channels/orders/{action}", ids=ids[:101], confirmed="yes")
            assert response.status_code == 400, action
            assert "100" in response.text and "nothing changed" in response.text
        assert len(DeadLetterWorkbench("orders", settings, clients).list().letters) == 102
        # ... while 100 are accepted (the confirmation page lists them)
        confirm = post(dash, "/channels/orders/delete", ids=ids[:100])
        assert confirm.status_code == 200 and confirm.text.count(ids[0]) >= 1
        # And a filter's preview of all 102 ticks the first 100 and says 2 more match
        preview = requests.get(dash.url + "/channels/orders/select", timeout=60,
                               params={"reason": "handler failed", "limit": "200"})
        assert 'data-matched="102"' in preview.text
        assert len(re.findall(r'name="ids" value="[^"]+" [^>]*checked', preview.text)) == 100
        assert "2 more letter(s) match" in preview.text and "Delete these 100" in preview.text


def test_cancel_job_under_a_channel_that_does_not_exist_is_a_404(settings, clients):
    channel(settings, clients)
    with served(settings, clients) as dash:
        for confirmed in ("", "yes"):
            response = post(dash, "/channels/nowhere/cancel-job", ids="job-1",
                            confirmed=confirmed)
            assert response.status_code == 404 and "no channel &#39;nowhere&#39;" in response.text
        # the channel that exists still takes it to its confirmation page
        assert post(dash, "/channels/orders/cancel-job", ids="job-1").status_code == 200


def test_a_prioritized_channels_levels_are_read_at_once(settings, clients):
    # Given 'jobs' with three levels, a dead letter in each level's DLQ
    resources = channel(settings, clients, name="jobs", priorities=("high", "medium", "low"))
    sqs = clients.client("sqs")
    for n, level in enumerate(resources.levels):
        dead_letter(sqs, level.dlq.url, Message({"n": n}, message_id=f"{level.spec.name}-1"))
    dlq_urls = {level.dlq.url for level in resources.levels}
    # When its page is opened, each DLQ's first receive waits until all three have begun
    # (read in turn, the first would wait alone until the barrier breaks)
    barrier = threading.Barrier(3, timeout=20)
    first: set[str] = set()
    broken: list[str] = []
    lock = threading.Lock()

    def hold(params, **_):  # (before-parameter-build: the call's own parameters)
        url = params.get("QueueUrl")
        with lock:
            if url not in dlq_urls or url in first:
                return
            first.add(url)
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            broken.append(url)

    with served(settings, clients) as dash, \
            injected(clients, "before-parameter-build.sqs.ReceiveMessage", hold):
        page = requests.get(dash.url + "/channels/jobs", timeout=120)
    # Then the three reads overlapped, and the letters are listed in the order of the levels'
    # queues (by name, as the workbench and `messenger dlq list` list them)
    assert broken == [] and first == dlq_urls
    assert page.status_code == 200
    listed = re.findall(r'<tr data-letter="([^"]+)"', page.text)
    assert listed == ["jobs-high-1", "jobs-low-1", "jobs-medium-1"]
    assert "3 dead letter(s) in " in page.text


def test_a_viewer_sees_no_tick_boxes(settings, clients):
    resources = channel(settings, clients)
    dead_letter(clients.client("sqs"), resources.dlq.url, Message({"n": 1}, message_id="job-1"))
    with alb_key_server() as signer:
        identity = AlbIdentity("eu-west-1", ALB_ARN, CLIENT_ID, frozenset({"ops"}),
                               groups_claim="custom:groups", key_url=signer.key_url)
        with served(settings, clients, identity=identity) as dash:
            headers = {"x-amzn-oidc-data": signer.token(VIEWER)}
            for path in ("/channels/orders", "/channels/orders/select?reason=handler+failed"):
                page = requests.get(dash.url + path, headers=headers, timeout=60)
                assert 'data-letter="job-1"' in page.text, path
                assert 'type="checkbox"' not in page.text, path
                assert 'id="read-only"' in page.text
            operator = {**VIEWER, "custom:groups": "ops"}
            page = requests.get(dash.url + "/channels/orders", timeout=60,
                                headers={"x-amzn-oidc-data": signer.token(operator)})
            assert 'name="ids"' in page.text and 'id="select-all"' in page.text


def test_a_cancelled_jobs_reason_is_shown_as_its_reason(settings, clients):
    channel(settings, clients)
    store = StatusStore(clients, settings)
    store.ensure_table()
    store.record(StatusRecord("job-5", StatusEvent.STARTED, "orders", consumer_id="c-1"))
    store.record(StatusRecord("job-5", StatusEvent.CANCELLED, "orders",
                              error="cancelled by ada@example.com", actor="ada@example.com"))
    store.record(StatusRecord("job-6", StatusEvent.FAILED, "orders", error_class="ValueError",
                              error="card declined"))
    store.close()
    with served(settings, clients) as dash:
        cancelled = requests.get(dash.url + "/job?id=job-5", timeout=60).text
        row = re.search(r'<tr data-event="CANCELLED">.*?</tr>', cancelled, re.S)
        assert row is not None
        assert '<td class="reason">cancelled by ada@example.com</td><td class="error"></td>' \
            in row.group(0)
        assert "<th>reason</th><th>error</th>" in cancelled
        failed = requests.get(dash.url + "/job?id=job-6", timeout=60).text
        assert '<td class="reason"></td><td class="error">ValueError: card declined</td>' \
            in failed


def test_a_pause_tag_holds_only_what_sqs_accepts(settings, clients):
    # SQS refuses a tag value with characters other than letters, digits, whitespace and
    # _ . : / = + - @ (moto does not check): an unverified operator's or the CLI's name has
    # parentheses
    resources = channel(settings, clients)
    report = pause(clients, settings, "orders", actor="ada@example.com (unverified)")
    assert report.ok, report.summary()
    tags = clients.client("sqs").list_queue_tags(QueueUrl=resources.queue.url)["Tags"]
    assert re.fullmatch(r"[\w\s.:/=+\-@]*", tags[TAG_PAUSED])
    assert tags[TAG_PAUSED].startswith("ada@example.com unverified@")
    # and the resume still names whose pause it ended
    assert "was paused by ada@example.com unverified at" in resume(
        clients, settings, "orders", actor="bob").summary()
