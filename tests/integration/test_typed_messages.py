"""Typed messages: pydantic models declared on a producer or consumer, against the moto server.
The producer validates before sending (per item in push_many), the consumer before the handler
(which gets the model instance); a body that does not validate is dead-lettered at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field

from messenger import ConsumerSettings, InvalidMessage, InvalidSettings, Producer
from messenger.aws import RequestCounter
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE
from messenger.schema import SCHEMA_VERSION_ATTRIBUTE
from tests.integration.helpers import drain
from tests.integration.test_consumer_runtime import (
    Recording,
    Running,
    dead_letters,
    wait_until,
)


class OrderV1(BaseModel):
    order_id: str
    amount: float


class Order(BaseModel):
    schema_version: ClassVar[str] = "2"
    order_id: str
    amount: Decimal = Field(gt=0)
    currency: str = "EUR"


class Refund(BaseModel):
    order_id: str
    reason: str


class OrderProducer(Producer):
    channel = "typed_orders"
    model = Order


class OldOrderProducer(Producer):
    channel = "typed_orders"
    model = OrderV1


class OrderEventProducer(Producer):
    channel = "typed_orders"
    model: ClassVar[Any] = {"ORDER.CREATED": Order, "ORDER.REFUNDED": Refund}


class Orders(Recording):
    channel = "typed_orders"
    model = (OrderV1, Order)  # both versions during the migration


@pytest.fixture
def run_consumer(settings, clients, tmp_path: Path) -> Iterator[Any]:
    started: list[Running] = []

    def start(cls: type) -> Running:
        runtime = ConsumerSettings(health_file=str(tmp_path / "health.json"), shutdown_timeout=10)
        run = Running(cls(settings=settings, clients=clients, runtime=runtime))
        started.append(run)
        return run

    yield start
    for run in started:
        if run.thread.is_alive():
            run.consumer.request_shutdown()
            run.thread.join(20)


def queue(clients, settings) -> str:
    name = f"{settings.namespace}-typed_orders"
    return clients.client("sqs").get_queue_url(QueueName=name)["QueueUrl"]


def test_the_producer_sends_the_validated_body_and_its_schema_version(settings, clients):
    producer = OrderProducer(settings=settings, clients=clients)
    producer.push({"order_id": "o-1", "amount": "12.50"})
    producer.push(Order(order_id="o-2", amount=Decimal("3")))
    got = drain(clients.client("sqs"), queue(clients, settings))
    # The body on the wire is the model's JSON (defaults filled, decimals as strings)
    assert [json.loads(m["Body"]) for m in got] == [
        {"order_id": "o-1", "amount": "12.50", "currency": "EUR"},
        {"order_id": "o-2", "amount": "3", "currency": "EUR"},
    ]
    assert {m["MessageAttributes"][SCHEMA_VERSION_ATTRIBUTE]["StringValue"] for m in got} == {"2"}
    with pytest.raises(InvalidMessage, match=r"^invalid: amount: Input should be greater than 0"):
        producer.push({"order_id": "o-3", "amount": -1})


def test_push_many_fails_only_the_invalid_items_naming_their_field(settings, clients):
    producer = OrderProducer(settings=settings, clients=clients)
    items = [{"order_id": f"o-{n}", "amount": n + 1} for n in range(12)]
    items[3] = {"order_id": "o-3"}                             # amount missing
    items[11] = {"order_id": "o-11", "amount": "lots"}         # not a number
    counter = RequestCounter().attach(clients)
    result = producer.push_many(items)
    counter.detach(clients)
    # Typing costs no request: the 10 valid items go out in one batch
    assert counter.counts["sqs.SendMessageBatch"] == 1
    assert [(f.index, f.code) for f in result.failures] == [
        (3, "InvalidBody"), (11, "InvalidBody")]
    assert result.failures[0].reason == "invalid: amount: Field required"
    assert result.failures[1].reason.startswith("invalid: amount: ")
    assert result.published == 10
    got = drain(clients.client("sqs"), queue(clients, settings))
    assert sorted(json.loads(m["Body"])["order_id"] for m in got) == sorted(
        f"o-{n}" for n in range(12) if n not in (3, 11))


def test_a_model_per_routing_key(settings, clients):
    producer = OrderEventProducer(settings=settings, clients=clients)
    producer.push({"order_id": "o-1", "reason": "broken"}, routing_key="ORDER.REFUNDED")
    with pytest.raises(InvalidMessage, match="^invalid: reason: Field required"):
        producer.push({"order_id": "o-1", "amount": 1}, routing_key="ORDER.REFUNDED")
    with pytest.raises(InvalidMessage, match="invalid: routing_key: .*no model for 'ORDER.X'"):
        producer.push({"order_id": "o-1"}, routing_key="ORDER.X")

    class Bad(Producer):
        channel = "typed_orders"
        model = dict

    with pytest.raises(InvalidSettings, match="Bad.model.*pydantic BaseModel subclass"):
        Bad(settings=settings, clients=clients)


@pytest.mark.timeout(60)
def test_the_consumer_hands_over_instances_of_either_version_and_dead_letters_the_rest(
    settings, clients, run_consumer
):
    # Given producers of both schema versions (a migration) and a foreign, unversioned sender
    OldOrderProducer(settings=settings, clients=clients).push({"order_id": "v1", "amount": 1.5})
    OrderProducer(settings=settings, clients=clients).push({"order_id": "v2", "amount": "2"})
    sqs = clients.client("sqs")
    url = queue(clients, settings)
    version_3 = {SCHEMA_VERSION_ATTRIBUTE: {"DataType": "String", "StringValue": "3"}}
    sqs.send_message(QueueUrl=url, MessageBody='{"order_id": "v3", "amount": "1"}',
                     MessageAttributes=version_3)
    sqs.send_message(QueueUrl=url, MessageBody='{"order_id": "bad", "amount": "-4"}',
                     MessageAttributes={
                         SCHEMA_VERSION_ATTRIBUTE: {"DataType": "String", "StringValue": "2"}})
    # When the consumer declaring both versions runs
    run = run_consumer(Orders)
    dead = dead_letters(clients, run.consumer, expected=2)
    wait_until(lambda: len(run.consumer.handled) == 2)
    run.stop()
    # Then the handler got each valid body as its own version's model instance
    bodies = sorted(run.consumer.handled, key=lambda m: m.body.order_id)
    assert [type(m.body) for m in bodies] == [OrderV1, Order]
    assert bodies[1].body.amount == Decimal("2")
    # And the others went to the DLQ at once (first receive), with why
    reasons = sorted(m["MessageAttributes"][DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"]
                     for m in dead)
    assert reasons[0].startswith("invalid: amount: Input should be greater than 0")
    assert reasons[1] == "invalid: schema_version: '3' is not one Orders accepts (None, '2')"
    assert len(run.consumer.named("dead_lettered")) == 2
    assert not run.consumer.named("failed")


def test_a_producer_without_a_model_never_imports_pydantic(settings, endpoint):
    # In a fresh interpreter: import messenger, push a message, check sys.modules
    code = """
import sys
from messenger import Producer, Settings
class Plain(Producer):
    channel = "typed_orders"
Plain(settings=Settings.from_env(namespace=sys.argv[1])).push({"n": 1})
print("pydantic" in sys.modules)
"""
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
    out = subprocess.run([sys.executable, "-c", code, settings.namespace], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stderr
