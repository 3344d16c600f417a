"""`messenger dashboard` over real HTTP against the local endpoint: actions only with this
process's token, from the dashboard's own Host and Origin, after a confirmation; bad requests get
a clear page and change nothing; a channel page reads one page of a deep DLQ, not all of it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import requests

from messenger.aws import RequestCounter
from messenger.operations.deadletters import DeadLetterWorkbench
from tests.dashboard import served
from tests.integration.helpers import decode, drain
from tests.integration.test_dlq_workbench import channel, counts, dead_letter

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from messenger import Message  # noqa: E402


@pytest.fixture
def orders(settings, clients):
    """A channel 'orders' whose DLQ holds job-0 .. job-3 (consumer verdicts with tracebacks)."""
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    for n in range(4):
        dead_letter(sqs, resources.dlq.url, Message({"n": n}, message_id=f"job-{n}"))
    return resources


def post(served_, path, host=None, origin=None, **form):
    headers = {"Host": host or f"127.0.0.1:{served_.port}"}
    if origin:
        headers["Origin"] = origin
    return requests.post(served_.url + path, data=form, headers=headers, timeout=30,
                         allow_redirects=False)


def dlq_ids(settings, clients):
    return sorted(x.id for x in DeadLetterWorkbench("orders", settings, clients).list().letters)


def problem(response) -> str:
    found = re.search(r'id="problem">([^<]*)<', response.text)
    return found.group(1) if found else ""


def test_actions_need_the_token_the_host_and_the_origin(settings, clients, orders):
    all_ids = ["job-0", "job-1", "job-2", "job-3"]
    with served(settings, clients) as dash:
        act = {"ids": "job-1", "confirmed": "yes"}
        # A forged POST (CSRF): no token, a wrong one -> 403, nothing moved
        assert post(dash, "/channels/orders/requeue", **act).status_code == 403
        refused = post(dash, "/channels/orders/requeue", token="x" * 43, **act)
        assert refused.status_code == 403 and "wrong action token" in problem(refused)
        # DNS rebinding: the right token under another host name -> 403, for reads too
        rebound = post(dash, "/channels/orders/requeue", host=f"evil.example:{dash.port}",
                       token=dash.token, **act)
        assert rebound.status_code == 403
        assert requests.get(dash.url + "/channels/orders", timeout=30, headers={
            "Host": f"evil.example:{dash.port}"}).status_code == 403
        assert requests.get(dash.url + "/", timeout=30, headers={
            "Host": "127.0.0.1:1"}).status_code == 403
        # Another site's page posting the form (Origin) -> 403
        assert post(dash, "/channels/orders/requeue", origin="http://evil.example",
                    token=dash.token, **act).status_code == 403
        assert dlq_ids(settings, clients) == all_ids
        # The right token asks first (nothing moved yet) ...
        asked = post(dash, "/channels/orders/requeue", token=dash.token, ids="job-1")
        assert asked.status_code == 200 and "Requeue 1 dead letter(s)" in asked.text
        assert dlq_ids(settings, clients) == all_ids
        # ... and the confirmed form moves exactly that letter, saying so
        done = post(dash, "/channels/orders/requeue", host=f"localhost:{dash.port}",
                    origin=f"http://localhost:{dash.port}", token=dash.token, **act)
        assert 'data-moved="1" data-failed="0" data-in-flight="0"' in done.text
    assert dlq_ids(settings, clients) == ["job-0", "job-2", "job-3"]
    assert [decode(m).message_id for m in drain(clients.client("sqs"), orders.queue.url)] == \
        ["job-1"]


def test_bad_requests_get_a_clear_page_and_change_nothing(settings, clients, orders):
    with served(settings, clients) as dash:
        def get(path):
            return requests.get(dash.url + path, timeout=30)

        unknown = get("/channels/nope")
        assert unknown.status_code == 404 and "no channel 'nope'" in problem(unknown).replace(
            "&#39;", "'")
        assert get("/channels/orders/letters/job-9").status_code == 404
        assert get("/channels/orders?limit=abc").status_code == 400
        assert get("/job?id=job-9").status_code == 404
        assert get("/job?id=job-9&channel=orders").status_code == 404
        assert get("/nowhere").status_code == 404
        token = dash.token
        cases = [
            ("/channels/orders/requeue", {"ids": "job-9", "confirmed": "yes"}, 404),
            ("/channels/orders/requeue", {"ids": ["job-1", "job-9"], "confirmed": "yes"}, 404),
            ("/channels/orders/delete", {"ids": "job-9", "confirmed": "yes"}, 404),
            ("/channels/orders/delete", {"confirmed": "yes"}, 400),
            ("/channels/orders/requeue", {"ids": "x" * 300, "confirmed": "yes"}, 400),
            ("/channels/orders/explode", {"ids": "job-1", "confirmed": "yes"}, 404),
            ("/channels/nope/requeue-all", {"confirmed": "yes"}, 404),
        ]
        for path, form, status in cases:
            response = post(dash, path, token=token, **form)
            assert response.status_code == status, (path, form, response.text[-300:])
            assert problem(response), path
        assert requests.get(dash.url + "/channels/orders/requeue", timeout=30).status_code == 405
        assert dlq_ids(settings, clients) == ["job-0", "job-1", "job-2", "job-3"]
        # The real actions still work: delete one, requeue two selected, then the whole DLQ
        deleted = post(dash, "/channels/orders/delete", token=token, ids="job-0",
                       confirmed="yes")
        assert 'data-deleted="1"' in deleted.text
        moved = post(dash, "/channels/orders/requeue", token=token, ids=["job-1", "job-2"],
                     confirmed="yes")
        assert 'data-moved="2" data-failed="0" data-in-flight="0"' in moved.text
        asked = post(dash, "/channels/orders/requeue-all", token=token)
        assert "Requeue 1 from" in asked.text and dlq_ids(settings, clients) == ["job-3"]
        everything = post(dash, "/channels/orders/requeue-all", token=token, confirmed="yes")
        assert 'data-moved="1" data-failed="0" data-in-flight="0"' in everything.text
    assert dlq_ids(settings, clients) == []
    assert sorted(decode(m).message_id for m in drain(clients.client("sqs"),
                                                      orders.queue.url)) == ["job-1", "job-2",
                                                                             "job-3"]


def test_a_deep_dlq_is_read_one_page_at_a_time(settings, clients):
    # Given a DLQ of 300 dead letters
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    for start in range(0, 300, 10):
        sqs.send_message_batch(QueueUrl=resources.dlq.url, Entries=[
            {"Id": str(n), "MessageBody": f'{{"n": {n}}}'} for n in range(start, start + 10)])
    counter = RequestCounter().attach(clients)
    with served(settings, clients) as dash:
        # When the channel page is opened, then the next page asked for
        first = requests.get(dash.url + "/channels/orders", timeout=60).text
        receives_first = counter.counts["sqs.ReceiveMessage"]
        second = requests.get(dash.url + "/channels/orders?limit=100", timeout=60).text
    # Then it lists 50, then 100, with 5 and 10 receives (not 30), and releases all of them
    assert first.count("data-letter=") == 50 and 'href="?limit=100"' in first
    assert second.count("data-letter=") == 100
    assert receives_first == 5
    assert counter.counts["sqs.ReceiveMessage"] == 15
    assert counts(sqs, resources.dlq.url) == (300, 0)


def test_cli_says_in_one_line_when_the_extra_is_missing_and_checks_its_port():
    blocked = ("import sys; sys.modules['starlette'] = None; "
               "from messenger.tools.cli import main; sys.exit(main(['dashboard']))")
    result = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True,
                            timeout=60, env={**os.environ})
    assert result.returncode == 2
    assert result.stderr.strip() == ("messenger: the dashboard needs its extra: pip install "
                                     "'messenger[dashboard]' (missing: starlette)")
    bad_port = subprocess.run([sys.executable, "-m", "messenger", "dashboard", "--port", "0"],
                              capture_output=True, text=True, timeout=60)
    assert bad_port.returncode == 2 and "--port must be 1 to 65535" in bad_port.stderr


def test_pages_show_workers_the_status_timeline_and_find_a_job(settings, clients, orders):
    from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
    from messenger.jobs.workers import WorkerRegistry

    auto = settings.with_changes(provisioning="auto")
    # Given a live worker of 'orders' that processed 7 and failed 2, holding 1
    registry = WorkerRegistry(clients, auto, "orders", "app.Charge")
    registry.processed, registry.failed = 7, 2
    registry.start("RUNNING")
    registry.beat("RUNNING", 1, force=True)
    # And a status timeline for job-2 (in the DLQ) and job-77 (done, in no DLQ)
    store = StatusStore(clients, auto)
    store.ensure_table()
    store.record(StatusRecord("job-2", StatusEvent.FAILED, "orders", error_class="ValueError",
                              error="card declined", receive_count=3))
    store.record(StatusRecord("job-77", StatusEvent.COMPLETED, "orders", duration=0.25))
    store.close()
    with served(settings, clients) as dash:
        def get(path):
            response = requests.get(dash.url + path, timeout=60)
            assert response.status_code == 200, (path, response.text[-300:])
            return response.text

        overview = get("/")
        assert re.search(r'data-field="workers">1<', overview)
        page = get("/channels/orders")
        assert registry.entry.worker_id in page
        assert re.search(r"<td>RUNNING</td>.*?<td class=\"n\">1</td>\s*<td class=\"n\">7</td>\s*"
                         r"<td class=\"n\">2</td>", page, re.S)
        # Found by id alone (its timeline names the channel): the letter page with its timeline
        found = get("/job?id=job-2")
        assert "Dead letter job-2" in found and 'id="timeline"' in found
        assert "ValueError: card declined" in found
        # A job in no DLQ: its timeline and where it was looked for
        done = get("/job?id=job-77")
        assert "completed" in done.lower() and "not in the dead letters of orders" in done
    registry.stop()


def test_the_command_serves_on_loopback_and_stops_on_ctrl_c(settings, clients, orders,
                                                            local_endpoint):
    import signal

    from tests.dashboard import free_port

    port = free_port()
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    process = subprocess.Popen([sys.executable, "-m", "messenger", "dashboard", "--port",
                                str(port)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert f"at http://127.0.0.1:{port}/" in line and settings.namespace in line
        page = None
        deadline = time.monotonic() + 30
        while page is None:  # the line is printed just before uvicorn binds
            try:
                page = requests.get(f"http://127.0.0.1:{port}/", timeout=30)
            except requests.ConnectionError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        assert page.status_code == 200
        assert 'data-channel="orders"' in page.text
        # Bound to loopback only: the port does not answer on another local address
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.2:{port}/", timeout=5)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
