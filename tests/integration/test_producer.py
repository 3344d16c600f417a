"""Producers against the moto server over HTTP: routing, offload, retries, reprovisioning."""

from __future__ import annotations

import json
import threading
import time

import pytest

from messenger import (
    ChannelNotFound,
    ChannelSpec,
    InvalidChannelSpec,
    InvalidMessage,
    MessageFilter,
    MultiProducer,
    PayloadTooLarge,
    Producer,
    PublishFailed,
    PushItem,
    aws,
)
from messenger.aws import ClientFactory, RequestCounter
from messenger.provision import Provisioner
from messenger.settings import Settings
from tests.faults import Blackhole, Throttle
from tests.integration.helpers import decode, drain, queue_url

KEYS = ["MOBILE.APPLE", "MOBILE.ANDROID", "WEB.CHROME", "MOBILE.APPLE", "TV", "MOBILE.APPLE.WATCH"]


class WishListEventProducer(MultiProducer):
    channel = "wishlist_events"
    ordered = True

    def meta_headers(self):
        return {"locale": "en_GB"}


class OrderProducer(Producer):
    channel = "orders"


def wishlist_consumers(namespace: str) -> list[ChannelSpec]:
    filters = {
        "all_events": None,
        "mobile_events": MessageFilter("prefix", ["MOBILE."]),
        "apple_events": MessageFilter("exact", ["MOBILE.APPLE"]),
        "not_web_events": MessageFilter("exclude", ["WEB.CHROME"]),
    }
    return [
        ChannelSpec(f"wishlist_events.{queue}", ordered=True, message_filter=f, namespace=namespace)
        for queue, f in filters.items()
    ]


def test_wishlist_exchange_routes_exactly_the_filtered_messages_in_order(settings, clients):
    # Given an ordered exchange with four consumer queues and their filters
    specs = wishlist_consumers(settings.namespace)
    provisioner = Provisioner(clients, settings)
    for spec in specs:
        provisioner.ensure_channel(spec)
    producer = WishListEventProducer(settings=settings, clients=clients)
    # When messages are pushed one by one and in a batch
    for n, key in enumerate(KEYS):
        producer.push({"n": n}, routing_key=key)
    producer.push_many([PushItem({"n": len(KEYS) + n}, key) for n, key in enumerate(KEYS)])
    sent = list(enumerate(KEYS + KEYS))
    # Then every queue holds exactly the messages its filter admits, in push order
    sqs = clients.client("sqs")
    for spec in specs:
        got = [decode(m) for m in drain(sqs, queue_url(sqs, spec.queue_name))]
        expected = [
            n for n, key in sent if spec.message_filter is None or spec.message_filter.matches(key)
        ]
        assert [m.body["n"] for m in got] == expected, spec.name
        assert all(m.meta_headers == {"locale": "en_GB"} for m in got)
        assert all(m.routing_key == KEYS[m.body["n"] % len(KEYS)] for m in got)


def test_large_body_round_trips_through_the_offload_bucket(settings, clients):
    counter = RequestCounter().attach(clients)
    producer = OrderProducer(settings=settings, clients=clients)
    # A queue's default threshold is SQS's 1 MiB: 600 KiB go inline (cheaper than S3), 1,100
    # KiB through the offload bucket
    big = {"blob": "x" * 1100 * 1024}
    small = {"blob": "y" * 600 * 1024}
    producer.push(small)
    assert not any(key.startswith("s3.") for key in counter.counts), counter.counts
    producer.push(big)
    assert counter.counts["s3.PutObject"] == 1
    sqs = clients.client("sqs")
    raw = drain(sqs, queue_url(sqs, f"{settings.namespace}-orders"))
    assert [len(m["Body"]) < 1000 for m in raw] == [False, True]  # the big one is a pointer
    assert len(raw[0]["Body"]) > 600 * 1024  # the small one is inline
    bodies = [decode(m, clients.client("s3")).body for m in raw]
    assert bodies == [small, big]


def test_characters_sqs_refuses_are_refused_only_in_what_goes_to_sqs(settings, clients):
    # Given a producer offloading bodies above 1,000 bytes
    producer = OrderProducer(settings=settings.with_changes(offload_threshold=1000),
                             clients=clients)
    odd = "\uffff\ufffe \U0001f600 \x00\x1f"  # SQS refuses U+FFFF/FFFE (and raw controls)
    big = {"text": "x" * 2000 + odd, "n": 1}
    # When the odd characters are in a body going to S3, push and push_many take it...
    first = producer.push(big)
    result = producer.push_many([
        {**big, "n": 2},  # S3: accepted
        {"text": odd, "n": 3},  # inline in SQS: refused, the field named
        PushItem({**big, "n": 4}, meta_headers={"k": "\uffff"}),  # a header goes to SQS
        PushItem({**big, "n": 5}, routing_key="KEY.\ufffe"),  # so does the routing key
        {"text": "x" * 2000 + "\ud800", "n": 6},  # a lone surrogate has no UTF-8 form at all
    ])
    # ...and refuses them wherever SQS would carry them, naming the field
    reasons = {f.index: f.reason for f in result.failures}
    assert sorted(reasons) == [1, 2, 3, 4], reasons
    assert reasons[1].startswith("body holds U+FFFF (a character SQS refuses)")
    assert reasons[2].startswith("meta_headers['k'] holds U+FFFF (a character SQS refuses)")
    assert reasons[3].startswith("routing_key holds U+FFFE (a character SQS refuses)")
    assert reasons[4].startswith("body holds U+D800 (a lone surrogate) at position 2009")
    with pytest.raises(InvalidMessage, match=r"^body holds U\+FFFF \(a character SQS refuses"):
        producer.push({"text": odd})
    with pytest.raises(InvalidMessage, match=r"^body holds U\+DFFF \(a lone surrogate\)"):
        producer.push({"text": "x" * 2000 + "\udfff"})
    # Then the accepted bodies are in S3 byte for byte as JSON writes them, SQS holds pointers
    sqs, s3 = clients.client("sqs"), clients.client("s3")
    raw = drain(sqs, queue_url(sqs, f"{settings.namespace}-orders"))
    assert result.message_ids[0] is not None and result.offloaded == 1
    assert len(raw) == 2
    expected = {1: big, 2: {**big, "n": 2}}
    for message in raw:
        pointer = json.loads(message["Body"])[1]
        stored = s3.get_object(Bucket=pointer["s3BucketName"], Key=pointer["s3Key"])
        body = decode(message, s3).body
        wanted = json.dumps(expected[body["n"]], separators=(",", ":"), ensure_ascii=False)
        assert stored["Body"].read() == wanted.encode("utf-8")
        assert body == expected[body["n"]]
        assert message["MessageAttributes"]["ExtendedPayloadSize"]["StringValue"] == str(
            len(wanted.encode("utf-8")))
    assert {decode(m, s3).message_id for m in raw} == {first, result.message_ids[0]}


def test_exchange_offloads_above_the_sns_limit_even_with_a_higher_setting(settings, clients):
    producer = WishListEventProducer(
        settings=settings.with_changes(offload_threshold=1_000_000), clients=clients
    )
    assert producer.threshold == 262_144
    provisioner = Provisioner(clients, settings)
    spec = wishlist_consumers(settings.namespace)[0]
    provisioner.ensure_channel(spec)
    producer.push({"blob": "z" * 300_000}, routing_key="TV")
    sqs = clients.client("sqs")
    [raw] = drain(sqs, queue_url(sqs, spec.queue_name))
    assert decode(raw, clients.client("s3")).body == {"blob": "z" * 300_000}


def test_throttling_on_a_third_of_calls_loses_no_message(settings, clients):
    throttle = Throttle(rate=0.3, operations={"SendMessage", "SendMessageBatch"})
    clients.register("before-send", throttle)
    producer = OrderProducer(
        settings=settings.with_changes(retry_budget_seconds=30), clients=clients
    )
    for n in range(6):
        producer.push({"n": n})
    result = producer.push_many(PushItem({"n": n}) for n in range(6, 66))
    assert result.failures == []
    clients.unregister("before-send", throttle)
    sqs = clients.client("sqs")
    got = sorted(
        decode(m).body["n"] for m in drain(sqs, queue_url(sqs, f"{settings.namespace}-orders"))
    )
    assert got == list(range(66))
    assert throttle.injected >= 2  # the fault really happened (seeded: same count every run)


def test_a_permanently_failing_endpoint_raises_within_the_budget(settings):
    # Nothing listens on port 9 of loopback: every connection is refused.
    dead = ClientFactory("us-east-1", endpoint_url="http://127.0.0.1:9")
    producer = OrderProducer(settings=settings.with_changes(retry_budget_seconds=2), clients=dead)
    started = time.monotonic()
    with pytest.raises(PublishFailed, match="retry budget"):
        producer.push({"n": 1})
    assert time.monotonic() - started < 20


def test_deleted_queue_is_reprovisioned_in_auto_mode(settings, clients):
    producer = OrderProducer(settings=settings, clients=clients)
    producer.push({"n": 1})
    sqs = clients.client("sqs")
    sqs.delete_queue(QueueUrl=queue_url(sqs, f"{settings.namespace}-orders"))
    producer.push({"n": 2})
    got = [decode(m).body for m in drain(sqs, queue_url(sqs, f"{settings.namespace}-orders"))]
    assert got == [{"n": 2}]
    # The DLQ and redrive came back with it.
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url(sqs, f"{settings.namespace}-orders"), AttributeNames=["RedrivePolicy"]
    )["Attributes"]
    assert f"{settings.namespace}-orders-dlq" in attributes["RedrivePolicy"]


def test_deleted_queue_fails_clearly_in_verify_mode(settings, clients):
    Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace)
    )
    producer = OrderProducer(settings=settings.with_changes(provisioning="verify"), clients=clients)
    producer.push({"n": 1})
    sqs = clients.client("sqs")
    sqs.delete_queue(QueueUrl=queue_url(sqs, f"{settings.namespace}-orders"))
    with pytest.raises(ChannelNotFound, match="provisioning=verify"):
        producer.push({"n": 2})


def test_verify_mode_names_the_missing_resource(settings, clients):
    producer = WishListEventProducer(
        settings=settings.with_changes(provisioning="verify"), clients=clients
    )
    with pytest.raises(
        ChannelNotFound, match=rf"topic '{settings.namespace}-wishlist_events.fifo'"
    ):
        producer.push({"n": 1})


def test_bad_input_gets_specific_errors(settings, clients):
    class Dotted(Producer):
        channel = "exchange.queue"

    with pytest.raises(InvalidChannelSpec, match="without '.<queue>'"):
        Dotted(settings=settings, clients=clients)

    class Invalid(Producer):
        channel = "bad name"

    producer = Invalid(settings=settings, clients=clients)
    with pytest.raises(InvalidChannelSpec, match="letters, digits"):
        producer.push({"n": 1})

    orders = OrderProducer(settings=settings, clients=clients)
    with pytest.raises(InvalidMessage, match="JSON-serializable"):
        orders.push({"when": object()})
    with pytest.raises(InvalidMessage, match="dedup_id applies to ordered channels only"):
        orders.push({"n": 1}, dedup_id="d")

    class Tiny(Producer):
        channel = "orders"
        max_payload_bytes = 500_000

    with pytest.raises(PayloadTooLarge, match="largest offloadable body is 500000"):
        Tiny(settings=settings, clients=clients).push({"blob": "x" * 600_000})


def test_push_many_reports_bad_items_and_delivers_the_rest(settings, clients):
    producer = OrderProducer(settings=settings, clients=clients)
    result = producer.push_many([{"n": 0}, {"bad": object()}, PushItem({"n": 2})])
    assert [f.index for f in result.failures] == [1]
    assert result.failures[0].code == "InvalidMessage"
    assert result.published == 2 and result.message_ids[1] is None
    with pytest.raises(PublishFailed, match="1 of 3 messages failed"):
        result.raise_for_failures()
    sqs = clients.client("sqs")
    got = [decode(m).message_id for m in drain(sqs, queue_url(sqs, f"{settings.namespace}-orders"))]
    assert sorted(got) == sorted([result.message_ids[0], result.message_ids[2]])


def test_producer_is_a_thread_safe_singleton(endpoint, monkeypatch):
    monkeypatch.setenv("MESSENGER_NAMESPACE", "single")
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(OrderProducer())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(p) for p in seen}) == 1
    assert OrderProducer() is seen[0]
    assert WishListEventProducer() is not seen[0]
    # Concurrent pushes through the shared instance all arrive.
    pushers = [threading.Thread(target=lambda: OrderProducer().push({"n": 1})) for _ in range(8)]
    for thread in pushers:
        thread.start()
    for thread in pushers:
        thread.join()
    sqs = ClientFactory("us-east-1").client("sqs")
    assert len(drain(sqs, queue_url(sqs, "single-orders"))) == 8


def test_ordered_push_uses_groups_and_optional_dedup(settings, clients):
    class Ordered(Producer):
        channel = "ledger"
        ordered = True

    producer = Ordered(settings=settings, clients=clients)
    producer.push({"n": 1}, group_id="account-1", dedup_id="d1")
    producer.push({"n": 1}, group_id="account-1", dedup_id="d1")  # deduplicated
    producer.push({"n": 2})
    sqs = clients.client("sqs")
    raw = drain(sqs, queue_url(sqs, f"{settings.namespace}-ledger.fifo"))
    assert [(m["Attributes"]["MessageGroupId"], decode(m).body["n"]) for m in raw] == [
        ("account-1", 1),
        ("ledger", 2),
    ]


def test_settings_come_from_the_environment(endpoint, monkeypatch):
    monkeypatch.setenv("MESSENGER_NAMESPACE", "envns")
    monkeypatch.setenv("MESSENGER_OFFLOAD_THRESHOLD", "1000")
    producer = OrderProducer()
    assert producer.settings == Settings.from_env()
    assert producer.threshold == 1000


def test_push_many_reports_a_non_transient_error_and_keeps_earlier_ids(settings, clients):
    # Given the first batch goes through and every later batch is refused (not a throttle)
    producer = OrderProducer(settings=settings, clients=clients)
    producer.push({"warm": 1})  # locate the queue first
    calls = []

    def deny_after_first(request, event_name="", **_):
        calls.append(event_name)
        if len(calls) > 1:
            from botocore.awsrequest import AWSResponse

            from tests.faults import _RawBody

            body = b'{"__type":"com.amazonaws.sqs#AccessDenied","message":"no"}'
            return AWSResponse(request.url, 403, {"x-amzn-query-error": "AccessDenied;Sender"},
                               _RawBody(body))
        return None

    clients.register("before-send.sqs.SendMessageBatch", deny_after_first)
    result = producer.push_many([{"n": n} for n in range(25)])
    clients.unregister("before-send.sqs.SendMessageBatch", deny_after_first)
    # Then the first 10 keep their ids and the other 15 are reported, none raised
    assert result.published == 10 and all(result.message_ids[:10])
    assert [f.index for f in result.failures] == list(range(10, 25))
    assert {f.code for f in result.failures} == {"AccessDenied"}


@pytest.mark.timeout(60)
def test_an_endpoint_that_never_answers_costs_at_most_the_budget_plus_one_attempt(settings):
    # Given an endpoint that accepts connections and never answers, a 1 s budget and 2 s calls
    hole = Blackhole()
    try:
        clients = ClientFactory("us-east-1", endpoint_url=hole.url, call_timeout=2)
        sends = RequestCounter().attach(clients)
        producer = OrderProducer(
            settings=settings.with_changes(retry_budget_seconds=1), clients=clients
        )
        started = time.monotonic()
        # When a push is attempted
        with pytest.raises(PublishFailed, match="retry budget"):
            producer.push({"n": 1})
        elapsed = time.monotonic() - started
    finally:
        hole.close()
    # Then the first timed-out attempt, already past the budget, is not retried by botocore
    # (4 attempts of 2 s each before), so the wall time is the budget plus one attempt at most.
    assert sends.total == 1
    assert elapsed < 1 + aws.CONNECT_TIMEOUT_SECONDS + 2


@pytest.mark.timeout(60)
def test_a_call_outside_any_budget_is_bounded_by_the_call_budget():
    # Given an endpoint that never answers, 2 s attempts and a 3 s call budget: what a CLI
    # command or a Lambda calling a client directly gets
    hole = Blackhole()
    try:
        clients = ClientFactory("us-east-1", endpoint_url=hole.url, call_timeout=2,
                                call_budget=3)
        sends = RequestCounter().attach(clients)
        started = time.monotonic()
        with pytest.raises(aws.ReadTimeoutError):
            clients.client("sqs").list_queues()
        elapsed = time.monotonic() - started
    finally:
        hole.close()
    # Then botocore stops after the attempt that ended past the 3 s (2 attempts, not 4)
    assert sends.total == 2
    assert elapsed < 3 + aws.CONNECT_TIMEOUT_SECONDS + 2


def test_a_publish_batch_goes_out_as_botocore_alone_would_encode_it(settings, clients):
    # Given a topic, a factory's sending client (form body encoded once, no parameter check)
    # and boto3's own client, and entries with text that url-encoding must escape
    topic = Provisioner(clients, settings).ensure_exchange("encoding", ordered=True)
    entries = [
        {
            "Id": str(n),
            "Message": f'{{"text":"a b&c=d+e/f~g%h é ✓ {n}"}}',
            "MessageGroupId": "g&=+ /",
            "MessageDeduplicationId": f"d{n}",
            "MessageAttributes": {"routing_key": {"DataType": "String", "StringValue": "A.B C"}},
        }
        for n in range(3)
    ]
    bodies: list[bytes] = []

    def record(request, **_):
        bodies.append(request.body)

    import boto3

    plain = boto3.client("sns", region_name="us-east-1")
    for client in (clients.client("sns", validate_params=False), plain):
        client.meta.events.register("before-send.sns.PublishBatch", record)
        # When each publishes the same batch
        response = client.publish_batch(TopicArn=topic, PublishBatchRequestEntries=entries)
        assert len(response["Successful"]) == 3
    # Then the bytes on the wire are the same
    assert bodies[0] == bodies[1]


def _user_agent_parts(header: str) -> tuple[list[str], set[str]]:
    """A User-Agent header's components, with its feature ids (`m/a,b,...`) as a set."""
    parts, features = [], set()
    for part in header.split(" "):
        if part.startswith("m/"):
            features = set(part[2:].split(","))
        else:
            parts.append(part)
    return parts, features


def test_a_factory_client_sends_the_user_agent_botocore_builds_also_when_features_change(
    endpoint,
):
    # Given a new factory's client (its User-Agent built once per feature set) and a new boto3
    # session's client with the same configuration, each recording the header it sends
    import boto3

    from messenger.aws import client_config

    sent: dict[str, list[str]] = {"factory": [], "plain": []}
    factory = ClientFactory("us-east-1").client("sqs")
    plain = boto3.session.Session(region_name="us-east-1").client("sqs", config=client_config())
    for name, client in (("factory", factory), ("plain", plain)):
        client.meta.events.register(
            "before-send.sqs", lambda request, who=name, **_: sent[who].append(
                request.headers["User-Agent"].decode()
                if isinstance(request.headers["User-Agent"], bytes)
                else request.headers["User-Agent"]))
        # When each makes plain calls, a paginated call (which adds a feature id) and a plain
        # call again
        client.list_queues(MaxResults=1)
        client.list_queues(MaxResults=1)
        for _ in client.get_paginator("list_queues").paginate(PaginationConfig={"MaxItems": 1}):
            pass
        client.list_queues(MaxResults=1)
    # Then every header is the one boto3 sends for that call (feature ids compared as a set)
    assert len(sent["factory"]) == len(sent["plain"]) == 4
    for mine, theirs in zip(sent["factory"], sent["plain"], strict=True):
        assert _user_agent_parts(mine) == _user_agent_parts(theirs), (mine, theirs)
    # and the paginated call's differs from the plain calls' (the cache keeps feature sets apart)
    assert _user_agent_parts(sent["factory"][2])[1] != _user_agent_parts(sent["factory"][0])[1]
    assert sent["factory"][3] == sent["factory"][0]
