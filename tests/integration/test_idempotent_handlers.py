"""Idempotent handlers (`idempotent = True`, `idempotency_key`) against the moto server: a
message delivered twice runs its handler once, the duplicate deleted with `duplicate_skipped`;
a handler that raised is not recorded as done; a key in progress elsewhere is not run twice."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from messenger import ConsumerSettings, ReceivedMessage
from messenger.aws import ClientFactory
from messenger.consume.idempotency import IdempotencyGuard, InProgressElsewhere
from messenger.errors import ChannelNotFound
from messenger.settings import Settings
from tests.integration.test_consumer_process import (  # noqa: F401 - fixtures
    messages_held,
    producer,
    queue_url,
    start,
)
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    producer_for,
    running,
    runtime,
    wait_until,
)


class ByOrder(Recording):
    channel = "idem_orders"
    idempotency_key = staticmethod(lambda message: message.body["order"])

    def handler(self, message: ReceivedMessage) -> None:
        super().handler(message)
        if message.body.get("fail") and message.receive_count == 1:
            raise RuntimeError("first attempt fails")


def test_same_key_twice_runs_the_handler_once_and_deletes_the_duplicate(running, settings):  # noqa: F811, E501
    # Given an idempotent consumer keyed on the order
    run = running(ByOrder)
    push = producer_for(settings, "idem_orders")
    # When the same order arrives twice (two messages, two message ids)
    push.push({"order": "A-1"})
    wait_until(lambda: run.consumer.named("completed"))
    push.push({"order": "A-1"})
    skipped = wait_until(lambda: run.consumer.named("duplicate_skipped"))
    # Then the handler ran once, and the duplicate was deleted (nothing left in the queue)
    assert [m.body for m in run.consumer.handled] == [{"order": "A-1"}]
    assert len(skipped) == 1
    wait_until(lambda: run.consumer.named("deleted") or _queue_empty(run))
    # A different key runs
    push.push({"order": "A-2"})
    wait_until(lambda: len(run.consumer.handled) == 2)


def _queue_empty(run: Any) -> bool:
    resources = run.consumer.resources
    attributes = run.consumer.clients.client("sqs").get_queue_attributes(
        QueueUrl=resources.queue.url, AttributeNames=["All"])["Attributes"]
    return attributes["ApproximateNumberOfMessages"] == "0" and \
        attributes["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_a_handler_that_raised_is_not_recorded_as_done(running, settings):  # noqa: F811
    # Given a handler that fails its first attempt
    run = running(ByOrder, retry_delay=0)
    producer_for(settings, "idem_orders").push({"order": "B-1", "fail": True})
    # Then the retry runs it again (its record was deleted) and completes
    wait_until(lambda: run.consumer.named("completed"), timeout=20)
    assert [m.receive_count for m in run.consumer.handled] == [1, 2]
    assert not run.consumer.named("duplicate_skipped")


def test_a_key_in_progress_elsewhere_is_not_run_twice(settings: Settings, clients: ClientFactory):
    # Given a handler running for key K in one consumer
    guard = IdempotencyGuard(clients, settings, "idem_orders", processing_timeout=30)
    entered, release = threading.Event(), threading.Event()
    message = type("M", (), {"message_id": "K"})()

    def slow(_: Any) -> None:
        entered.set()
        release.wait(10)

    first = threading.Thread(target=guard.run, args=(slow, message))
    first.start()
    assert entered.wait(10)
    # When another delivery of K arrives meanwhile
    ran: list[bool] = []
    with pytest.raises(InProgressElsewhere) as busy:
        guard.run(lambda _: ran.append(True), message)
    # Then it is not run, and is told to come back after the processing timeout
    assert not ran and busy.value.retry_after == 30
    release.set()
    first.join()


def test_killed_between_handler_and_delete_the_redelivery_does_not_run_again(
        start, producer, clients, settings, tmp_path: Path):  # noqa: F811
    # Given an idempotent consumer process that dies right before it deletes its first message
    marker = tmp_path / "died"
    dying = start("IdempotentConsumer", CONSUMER_TEST_DIE_BEFORE_DELETE=str(marker))
    producer.push({"n": 1})
    dying.process.wait(30)
    assert marker.exists() and dying.process.returncode == 9
    assert [r["receive_count"] for r in dying.records()] == [1]
    # When a new process gets the message again (its 2 s lease lapsed)
    again = start("IdempotentConsumer")
    skipped = again.wait_for_event("duplicate_skipped", timeout=30)
    # Then the handler did not run again, and the message is gone
    assert skipped["receive_count"] >= 2
    assert len(again.records()) == 1
    url = queue_url(clients, settings)
    wait_until(lambda: messages_held(clients, url) == 0, timeout=15)


def test_a_consumer_without_idempotent_loads_no_powertools() -> None:
    # A fresh interpreter that builds a plain consumer and its runtime imports nothing new
    code = (
        "import sys\n"
        "from messenger import Consumer\n"
        "import messenger.consume.runtime, messenger.consume.idempotency\n"
        "class Plain(Consumer):\n"
        "    channel = 'plain'\n"
        "    def handler(self, message): pass\n"
        "assert Plain.idempotent is False\n"
        "print('aws_lambda_powertools' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_missing_table_in_verify_mode_stops_the_start_naming_it(
        settings: Settings, clients: ClientFactory, tmp_path: Path) -> None:
    # Given the channel deployed but not the idempotency table (provisioning=verify)
    producer_for(settings, "idem_orders").push({"order": "warm"})
    verify = settings.with_changes(provisioning="verify")
    consumer = ByOrder(settings=verify, clients=clients,
                       runtime=ConsumerSettings(health_file=str(tmp_path / "h.json")))
    # When it starts, Then it stops before taking a message, naming the table
    with pytest.raises(ChannelNotFound, match="idempotency table .*messenger-idempotency"):
        consumer.run()


def test_a_delivery_whose_key_runs_elsewhere_goes_back_to_the_queue_not_failed(
        running, settings):  # noqa: F811
    # Given a consumer, and another run of key C-1 in progress (held open by this test)
    run = running(ByOrder)
    wait_until(lambda: run.consumer.resources)
    entered, release = threading.Event(), threading.Event()

    def elsewhere(_: Any) -> None:
        entered.set()
        release.wait(20)

    holder = threading.Thread(target=run.consumer.idempotency.run,
                              args=(elsewhere, type("M", (), {"body": {"order": "C-1"}})()))
    holder.start()
    assert entered.wait(10)
    # When a message for C-1 arrives
    producer_for(settings, "idem_orders").push({"order": "C-1"})
    busy = wait_until(lambda: run.consumer.named("duplicate_in_progress"))
    # Then its handler did not run, it was neither failed nor dead-lettered, and it waits in
    # the queue for the processing timeout
    release.set()
    holder.join()
    assert busy[0].fields["retry_after"] == ByOrder.processing_timeout
    assert run.consumer.handled == []
    assert not run.consumer.named("failed") and not run.consumer.named("dead_lettered")
    assert not _queue_empty(run)


class QuickOrders(ByOrder):
    """ByOrder with a 2 s processing timeout: shorter than the retry budget within which the
    idempotency store's calls retry a throttled answer (the tests give it BUDGET)."""

    channel = "idem_quick"
    processing_timeout = 2


#: QuickOrders' retry budget (seconds) in the tests: 1.5 s past its processing timeout.
BUDGET = 3.5


def test_a_throttled_claim_is_retried_later_never_dead_lettered_as_a_timeout(
        running, settings, clients):  # noqa: F811
    from tests.faults import Throttle, injected

    # Given an idempotent consumer whose DynamoDB PutItem (the claim) is throttled every time
    throttle = Throttle(1.0, {"PutItem"})
    with injected(clients, "before-send.dynamodb.PutItem", throttle):
        run = running(QuickOrders, {"retry_budget_seconds": BUDGET}, retry_delay=30)
        producer_for(settings, "idem_quick").push({"order": "T-1"})
        # When its claim spends the whole retry budget (3.5 s, past the 2 s processing timeout)
        retried = wait_until(lambda: run.consumer.named("retried"), timeout=30)
    # Then the message waits for its retry: not dead-lettered, not failed, handler not run
    assert throttle.injected > 1
    assert "StoreUnavailable" in retried[0].fields["error"]
    assert not run.consumer.named("timed_out") and not run.consumer.named("dead_lettered")
    assert not run.consumer.named("failed") and run.consumer.handled == []
    assert not _queue_empty(run)


def test_a_throttled_completion_record_deletes_the_message_all_the_same(
        running, settings, clients):  # noqa: F811
    from tests.faults import Throttle, injected

    # Given an idempotent consumer whose DynamoDB UpdateItem (the COMPLETED record) is throttled
    throttle = Throttle(1.0, {"UpdateItem"})
    with injected(clients, "before-send.dynamodb.UpdateItem", throttle):
        run = running(QuickOrders, {"retry_budget_seconds": BUDGET})
        producer_for(settings, "idem_quick").push({"order": "T-2"})
        # When the handler completed and the record cannot be written within the budget
        completed = wait_until(lambda: run.consumer.named("completed"), timeout=30)
    # Then it is reported, and the message is deleted as completed: the handler ran once and
    # no requeue can run it again
    [failed] = run.consumer.named("idempotency_record_failed")
    assert failed.fields["completed"] is True and throttle.injected > 1
    assert completed and not run.consumer.named("timed_out")
    assert not run.consumer.named("dead_lettered")
    wait_until(lambda: _queue_empty(run), timeout=15)
    assert [m.body for m in run.consumer.handled] == [{"order": "T-2"}]


def test_the_guard_reads_the_statuses_powertools_stores(settings: Settings,
                                                        clients: ClientFactory):
    # Given a guard's key begun (IN_PROGRESS) and then completed, as Powertools writes them
    from messenger.consume.idempotency import RECORD_COMPLETED, RECORD_INPROGRESS, AlreadyDone
    from tests.faults import injected

    guard = IdempotencyGuard(clients, settings, "idem_orders", processing_timeout=30)
    message = type("M", (), {"message_id": "K"})()
    dynamodb = clients.client("dynamodb")

    def stored() -> list[str]:
        items = dynamodb.scan(TableName=guard.table, ConsistentRead=True)["Items"]
        return [item["status"]["S"] for item in items]

    key = guard.begin(message)
    # Then the table holds the status the guard compares with, at each step
    assert stored() == [RECORD_INPROGRESS]
    puts: list[str] = []
    with injected(clients, "before-call.dynamodb.PutItem", lambda **_: puts.append("put")), \
            pytest.raises(InProgressElsewhere):
        guard.begin(message)
    assert puts == ["put"]  # told at the first look (the status compared), not after 3 puts
    guard.complete(key)
    assert stored() == [RECORD_COMPLETED]
    with pytest.raises(AlreadyDone):
        guard.begin(message)
