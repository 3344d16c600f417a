"""A channel's history page: server-rendered SVG charts from the local endpoint's CloudWatch
metrics (messenger.tools.moto_metrics publishes SQS's per-minute metrics as AWS does), over the
last hour, day or week; nothing loaded from elsewhere."""

from __future__ import annotations

import re

import pytest
import requests

from messenger import Message
from tests.dashboard import served
from tests.integration.test_dlq_workbench import channel, dead_letter

pytest.importorskip("starlette", reason="the dashboard extra is not installed")


def totals(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-metric="(\w+)" data-total="([^"]*)"', html))


def test_history_charts_count_what_happened(settings, clients):
    # Given 3 messages in, 2 of them done, and one dead letter
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    for n in range(3):
        sqs.send_message(QueueUrl=resources.queue.url, MessageBody=f'{{"n": {n}}}')
    received = sqs.receive_message(QueueUrl=resources.queue.url, MaxNumberOfMessages=2,
                                   WaitTimeSeconds=1)["Messages"]
    for message in received[:2]:
        sqs.delete_message(QueueUrl=resources.queue.url, ReceiptHandle=message["ReceiptHandle"])
    dead_letter(sqs, resources.dlq.url, Message({"n": 9}, message_id="job-9"))
    with served(settings, clients) as dash:
        page = requests.get(dash.url + "/channels/orders/history?window=hour", timeout=30)
        assert page.status_code == 200
        # Then the charts say so (sums over the hour)
        found = totals(page.text)
        assert set(found) == {"in", "out", "received", "dead_lettered", "dlq_depth",
                              "oldest_age"}
        assert (found["in"], found["out"], found["dead_lettered"]) == ("3", "2", "1")
        assert found["received"] == str(len(received))
        # Rendered here, as SVG: no script, no image or stylesheet from anywhere else
        assert page.text.count("<svg") == 6
        assert not re.search(r'(src|href)="https?://', page.text)
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        # The day and the week too; a bad window or channel gets a clear page
        for window in ("day", "week"):
            other = requests.get(dash.url + f"/channels/orders/history?window={window}",
                                 timeout=30)
            assert other.status_code == 200 and totals(other.text)["in"] == "3"
        bad = requests.get(dash.url + "/channels/orders/history?window=year", timeout=30)
        assert bad.status_code == 400 and "window is one of hour, day, week" in bad.text
        assert requests.get(dash.url + "/channels/nope/history", timeout=30).status_code == 404
