"""Bulk actions by filter and search, over HTTP against the local endpoint: a filter's preview
lists exactly the letters (by SQS MessageId) an action will name, and the action moves those and
no others; a bad filter gets a page saying which field is wrong; a search finds a job id across
channels, an error type and a text in bodies, and shows what it cost in AWS requests."""

from __future__ import annotations

import json
import re
import time

import pytest
import requests

from messenger import Message
from messenger.message import DEAD_LETTER_FAILURE_ATTRIBUTE, DEAD_LETTER_REASON_ATTRIBUTE
from messenger.operations.deadletters import DeadLetterWorkbench
from tests.dashboard import served
from tests.integration.helpers import decode, drain
from tests.integration.test_dlq_workbench import channel

pytest.importorskip("starlette", reason="the dashboard extra is not installed")


def letter(sqs, url, message_id, body, error_type="ValueError", reason="handler failed",
           produced_at=None):
    """A dead letter as a consumer leaves it, with this error type and production time."""
    message = Message(body, message_id=message_id)
    if produced_at is not None:
        message = Message(body, message_id=message_id, produced_at=produced_at)
    encoded = message.encode()
    attributes = dict(encoded.attributes)
    attributes[DEAD_LETTER_REASON_ATTRIBUTE] = {"DataType": "String", "StringValue": reason}
    attributes[DEAD_LETTER_FAILURE_ATTRIBUTE] = {"DataType": "String", "StringValue": json.dumps(
        {"error_type": error_type, "error_message": f"{error_type} in {message_id}",
         "traceback": f"Traceback ...\n{error_type}: boom\n", "attempts": 3})}
    sqs.send_message(QueueUrl=url, MessageBody=encoded.body, MessageAttributes=attributes)


@pytest.fixture
def letters(settings, clients):
    """orders: a-1, a-2 (ValueError, customer 7), b-1 (KeyError, customer 7), c-1 (ValueError,
    customer 8, two days old); refunds: r-1 (TimeoutError, 'card declined' in its body)."""
    sqs = clients.client("sqs")
    orders, refunds = channel(settings, clients), channel(settings, clients, name="refunds")
    letter(sqs, orders.dlq.url, "a-1", {"customer": {"id": 7}, "sku": "x"})
    letter(sqs, orders.dlq.url, "a-2", {"customer": {"id": 7}, "sku": "y"})
    letter(sqs, orders.dlq.url, "b-1", {"customer": {"id": 7}}, error_type="KeyError")
    letter(sqs, orders.dlq.url, "c-1", {"customer": {"id": 8}},
           produced_at=time.time() - 2 * 86_400)
    letter(sqs, refunds.dlq.url, "r-1", {"note": "Card declined twice"},
           error_type="TimeoutError", reason="processing timeout")
    return orders, refunds


def sqs_ids(settings, clients, name="orders"):
    return {x.id: x.sqs_message_id
            for x in DeadLetterWorkbench(name, settings, clients).list().letters}


def chosen(html: str) -> list[str]:
    return re.findall(r'name="ids" value="([^"]+)"[^>]*checked', html)


def test_preview_names_exactly_what_the_action_moves(settings, clients, letters):
    orders, _ = letters
    ids = sqs_ids(settings, clients)
    with served(settings, clients) as dash:
        # Given a filter: ValueError, customer.id 7, younger than a day
        preview = requests.get(dash.url + "/channels/orders/select", timeout=30, params={
            "error_type": "ValueError", "body_field": "customer.id", "body_value": "7",
            "younger_than": "1d"})
        assert preview.status_code == 200
        # Then the preview lists a-1 and a-2, by SQS MessageId, and nothing else
        assert sorted(chosen(preview.text)) == sorted([ids["a-1"], ids["a-2"]])
        assert 'data-matched="2" data-scanned="4"' in preview.text
        # Other filters: reason text, age, a field's presence
        for params, expected in (
                ({"error_type": "KeyError"}, ["b-1"]),
                ({"older_than": "1d"}, ["c-1"]),
                ({"body_field": "sku"}, ["a-1", "a-2"]),
                ({"text": "KeyError in b"}, ["b-1"]),
                ({"reason": "HANDLER"}, ["a-1", "a-2", "b-1", "c-1"])):
            got = chosen(requests.get(dash.url + "/channels/orders/select", params=params,
                                      timeout=30).text)
            assert sorted(got) == sorted(ids[x] for x in expected), params
        # When those two are requeued (the preview's form, then the confirmation)
        form = {"token": dash.token, "ids": chosen(preview.text)}
        asked = requests.post(dash.url + "/channels/orders/requeue", data=form, timeout=30)
        assert "Requeue 2 dead letter(s)" in asked.text
        done = requests.post(dash.url + "/channels/orders/requeue", timeout=30,
                             data={**form, "confirmed": "yes"})
        assert 'data-moved="2" data-failed="0"' in done.text
    # Then exactly a-1 and a-2 left the DLQ
    assert sorted(sqs_ids(settings, clients)) == ["b-1", "c-1"]
    assert sorted(decode(m).message_id for m in drain(clients.client("sqs"), orders.queue.url)) \
        == ["a-1", "a-2"]


def test_a_bad_filter_says_which_field_is_wrong(settings, clients, letters):
    with served(settings, clients) as dash:
        for params, words in (
                ({"older_than": "yesterday"}, "older than is a duration"),
                ({"body_value": "7"}, "body value needs a body field"),
                ({"body_field": "a..b"}, "body field is a dotted path"),
                ({"older_than": "2d", "younger_than": "1d"}, "older than must be less"),
                ({"limit": "5000"}, "limit must be 1 to 1000"),
                ({"text": "x" * 300}, "text is at most 200"),
                ({"reason": "<script>alert(1)</script>\x00"}, "printable")):
            response = requests.get(dash.url + "/channels/orders/select", params=params,
                                    timeout=30)
            assert response.status_code == 400, params
            assert words in response.text.replace("&#39;", "'"), (params, response.text[-400:])
            assert "<script>alert" not in response.text
    assert len(sqs_ids(settings, clients)) == 4


def test_search_across_channels_shows_its_cost(settings, clients, letters):
    with served(settings, clients) as dash:
        def search(**params):
            response = requests.get(dash.url + "/search", params=params, timeout=60)
            assert response.status_code == 200, response.text[-300:]
            found = re.findall(r'<tr data-letter="([^"]+)" data-channel="([^"]+)"', response.text)
            cost = re.search(r'data-requests="(\d+)" data-scanned="(\d+)"', response.text)
            assert cost, response.text[-500:]
            return sorted(found), int(cost.group(1)), int(cost.group(2))

        # A job id, without naming its channel
        found, requests_made, scanned = search(job_id="r-1")
        assert found == [("r-1", "refunds")] and scanned == 5 and requests_made > 0
        # An error type, in every channel
        assert search(error_type="ValueError")[0] == [("a-1", "orders"), ("a-2", "orders"),
                                                      ("c-1", "orders")]
        # Text in a body, case-insensitive
        assert search(text="card DECLINED")[0] == [("r-1", "refunds")]
        # Bounded: one letter per channel read at most
        _, _, scanned = search(text="x", per_channel="1")
        assert scanned == 2
        assert requests.get(dash.url + "/search", params={"text": "x", "per_channel": "0"},
                            timeout=30).status_code == 400
    assert len(sqs_ids(settings, clients)) == 4
