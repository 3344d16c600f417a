"""push_many never aborts on one item; ordered duplicates and caller keys give recognisable ids.

Against the moto server over HTTP: what arrives in the queue is read back like a consumer would.
"""

from __future__ import annotations

import pytest

from messenger import InvalidMessage, MultiProducer, Producer, PushItem
from messenger.channel import ChannelSpec
from messenger.provision import Provisioner
from tests.integration.helpers import decode, drain, queue_url


class OrderProducer(Producer):
    channel = "orders"


class LedgerProducer(Producer):
    channel = "ledger"
    ordered = True


def _received(clients, name):
    sqs = clients.client("sqs")
    return [decode(m) for m in drain(sqs, queue_url(sqs, name))]


def test_every_bad_item_is_a_failure_naming_its_field_and_the_rest_are_sent(settings, clients):
    producer = OrderProducer(settings=settings, clients=clients)
    items = [
        {"n": 0},
        PushItem({"n": 1}, meta_headers=["locale", "en"]),  # not a mapping (was a TypeError)
        PushItem({"n": 2}, meta_headers={"locale": 5}),
        {"text": "broken \ud800 surrogate"},  # lone surrogate (was a UnicodeEncodeError)
        PushItem({"n": 4}, routing_key="KEY.\udfff"),
        PushItem({"n": 5}, meta_headers={"locale": "en\ud83d"}),
        {"text": "not a character \uffff"},
        PushItem({"n": 7}, message_id="has spaces in it"),
        PushItem({"n": 8}, priority=3),
        {"n": 9, "emoji": "\U0001f600 fine", "tab": "\t fine"},
        PushItem({"n": 10}, routing_key="MOBILE.APPLE", meta_headers={"locale": "fr"}),
    ]
    result = producer.push_many(items)

    reasons = {f.index: f.reason for f in result.failures}
    assert sorted(reasons) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert {f.code for f in result.failures} == {"InvalidMessage"}
    assert "meta_headers must be a mapping" in reasons[1] and "list" in reasons[1]
    assert "meta_headers must map strings to strings" in reasons[2]
    assert reasons[3].startswith("body holds U+D800 (a lone surrogate)")
    assert reasons[4].startswith("routing_key holds U+DFFF")
    assert reasons[5].startswith("meta_headers['locale'] holds U+D83D")
    assert reasons[6].startswith("body holds U+FFFF (a character SQS refuses)")
    assert reasons[7].startswith("message_id must be 1 to 128")
    assert "priority 3" in reasons[8]
    # The valid items went out, each under the id the result reports.
    arrived = {m.message_id: m for m in _received(clients, f"{settings.namespace}-orders")}
    assert sorted(arrived) == sorted(result.message_ids[i] for i in (0, 9, 10))
    assert arrived[result.message_ids[9]].body["emoji"] == "\U0001f600 fine"
    assert arrived[result.message_ids[10]].meta_headers == {"locale": "fr"}


def test_a_single_push_raises_the_same_clear_error(settings, clients):
    producer = OrderProducer(settings=settings, clients=clients)
    with pytest.raises(InvalidMessage, match="meta_headers must be a mapping"):
        producer.push({"n": 1}, meta_headers="locale=en")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match=r"^body holds U\+DC00"):
        producer.push("\udc00")


def test_a_broken_producer_meta_headers_fails_every_item_without_raising(settings, clients):
    class Broken(Producer):
        channel = "orders"

        def meta_headers(self):
            return "en_GB"  # a str, not a mapping

    result = Broken(settings=settings, clients=clients).push_many([{"n": 1}, {"n": 2}])
    assert result.published == 0
    assert [f.index for f in result.failures] == [0, 1]
    assert "meta_headers() of the producer must be a mapping" in result.failures[0].reason


def test_an_invalid_fifo_id_fails_its_item_not_its_batch(settings, clients):
    # Given one item whose group id SQS would refuse, which would fail the whole batch request
    producer = LedgerProducer(settings=settings, clients=clients)
    items = [PushItem({"n": n}, group_id="account-1") for n in range(5)]
    items[2] = PushItem({"n": 2}, group_id="account 1")  # a space: not allowed
    items[3] = PushItem({"n": 3}, dedup_id="x" * 129)
    result = producer.push_many(items)
    assert [f.index for f in result.failures] == [2, 3]
    assert "group_id must be 1 to 128" in result.failures[0].reason
    assert "dedup_id must be 1 to 128" in result.failures[1].reason
    got = _received(clients, f"{settings.namespace}-ledger.fifo")
    assert [m.body["n"] for m in got] == [0, 1, 4]


def test_an_unexpected_error_while_sending_is_reported_per_item(settings, clients):
    # Given the second batch request blows up with a non-AWS exception inside the client
    producer = OrderProducer(settings=settings, clients=clients)
    producer.push({"warm": 1})
    calls = []

    def explode(**_):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("serializer bug")

    clients.register("before-send.sqs.SendMessageBatch", explode)
    try:
        result = producer.push_many([{"n": n} for n in range(25)])
    finally:
        clients.unregister("before-send.sqs.SendMessageBatch", explode)
    # Then the batch it hit is reported and the batches before and after are sent
    assert [f.index for f in result.failures] == list(range(10, 20))
    assert {f.code for f in result.failures} == {"RuntimeError"}
    assert result.published == 15


def test_an_ordered_duplicate_returns_the_id_of_the_message_it_repeats(settings, clients):
    producer = LedgerProducer(settings=settings, clients=clients)
    first = producer.push({"same": 1})
    second = producer.push({"same": 1})
    other_key = producer.push({"same": 1}, routing_key="OTHER")
    other_group = producer.push({"same": 1}, group_id="account-2")
    assert first == second  # a duplicate: the caller can tell
    assert len({first, other_key, other_group}) == 3  # different content: different messages
    got = _received(clients, f"{settings.namespace}-ledger.fifo")
    assert sorted(m.message_id for m in got) == sorted([first, other_key, other_group])


def test_an_ordered_exchange_duplicate_is_recognisable_too(settings, clients):
    class Events(MultiProducer):
        channel = "ledger_events"
        ordered = True

    spec = ChannelSpec("ledger_events.audit", ordered=True, namespace=settings.namespace)
    Provisioner(clients, settings).ensure_channel(spec)
    producer = Events(settings=settings, clients=clients)
    ids = producer.push_many([{"a": 1}, {"a": 2}, {"a": 1}]).message_ids
    assert ids[0] == ids[2] and ids[0] != ids[1]
    got = _received(clients, spec.queue_name)
    assert [m.body for m in got] == [{"a": 1}, {"a": 2}]
    assert [m.message_id for m in got] == ids[:2]


def test_a_retried_push_many_with_caller_keys_reuses_ids_and_deduplicates(settings, clients):
    # Given a push_many whose process died before the caller saw the result
    producer = LedgerProducer(settings=settings, clients=clients)
    items = [PushItem({"order": n, "at": 1.5}, message_id=f"order-{n}") for n in range(12)]
    first = producer.push_many(items[:7])  # "killed" after 7 items
    # When the caller retries the whole list with the same keys
    retry = producer.push_many(items)
    # Then the ids are the caller's keys and the queue holds each order exactly once
    assert first.message_ids == [f"order-{n}" for n in range(7)]
    assert retry.message_ids == [f"order-{n}" for n in range(12)]
    got = _received(clients, f"{settings.namespace}-ledger.fifo")
    assert [m.message_id for m in got] == [f"order-{n}" for n in range(12)]


def test_a_standard_channel_keeps_the_callers_message_id(settings, clients):
    producer = OrderProducer(settings=settings, clients=clients)
    assert producer.push({"n": 1}, message_id="order-42") == "order-42"
    got = _received(clients, f"{settings.namespace}-orders")
    assert [m.message_id for m in got] == ["order-42"]
