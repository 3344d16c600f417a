"""Batch entries SQS refuses are not taken for done: a requeue deletes from the DLQ only what the
destination accepted, and a dead-letter delete counts only what SQS deleted.

SQS answers a batch call 200 with per-entry results: an entry in `Failed` was not applied (on AWS:
an internal error, a throttled entry, a stale receipt handle), the others were. `RefusedEntries`
makes that happen on the real client and the real moto server: the refused entries are taken out
of the request before it is signed and sent (so SQS really does not apply them) and come back in
the answer's `Failed` list, as SQS's own answer would list them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from messenger import ChannelSpec
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE, MESSAGE_ID_ATTRIBUTE, Message
from messenger.operations.deadletters import DeadLetterWorkbench
from messenger.operations.requeue import Requeuer
from messenger.provision import Provisioner
from messenger.tools import cli
from messenger.tools.runtime import CommandRuntime
from tests.integration.helpers import decode, drain


class RefusedEntries:
    """botocore hooks for one batch operation of SQS: entries for which `refuse(entry)` is true
    are removed from the request (`before-parameter-build`) and added to the parsed answer's
    `Failed` (`after-call`), with `code`; `refused` lists the entries refused so far."""

    def __init__(self, operation: str, refuse: Callable[[dict[str, Any]], bool],
                 code: str = "InternalError") -> None:
        self.operation, self.refuse, self.code = operation, refuse, code
        self.refused: list[dict[str, Any]] = []

    def before(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        refused = [entry for entry in params["Entries"] if self.refuse(entry)]
        params["Entries"] = [entry for entry in params["Entries"] if entry not in refused]
        context["refused_entries"] = refused
        self.refused.extend(refused)

    def after(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        parsed.setdefault("Failed", []).extend(
            {"Id": entry["Id"], "SenderFault": False, "Code": self.code,
             "Message": "We encountered an internal error. Please try again."}
            for entry in context.get("refused_entries", []))

    def register(self, clients: Any) -> None:
        clients.register(f"before-parameter-build.sqs.{self.operation}", self.before)
        clients.register(f"after-call.sqs.{self.operation}", self.after)

    def unregister(self, clients: Any) -> None:
        clients.unregister(f"before-parameter-build.sqs.{self.operation}", self.before)
        clients.unregister(f"after-call.sqs.{self.operation}", self.after)

    @contextmanager
    def on(self, clients: Any) -> Iterator[RefusedEntries]:
        self.register(clients)
        try:
            yield self
        finally:
            self.unregister(clients)


def job_id(entry: dict[str, Any]) -> str:
    return str(entry["MessageAttributes"][MESSAGE_ID_ATTRIBUTE]["StringValue"])


def dead_letters(sqs: Any, url: str, ids: list[str]) -> None:
    for message_id in ids:
        encoded = Message({"id": message_id}, message_id=message_id).encode()
        sqs.send_message(QueueUrl=url, MessageBody=encoded.body, MessageAttributes={
            **encoded.attributes,
            DEAD_LETTER_REASON_ATTRIBUTE: {"DataType": "String", "StringValue": "poison"}})


def held_and_visible(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"])


def receive_ids(sqs: Any, url: str, expected: int, timeout: float = 30.0) -> list[str]:
    """The message ids of `expected` messages of a queue (received and deleted), waiting for
    them to become visible (long polls), at most `timeout` seconds."""
    found: list[str] = []
    deadline = time.monotonic() + timeout
    while len(found) < expected and time.monotonic() < deadline:
        found += [decode(m).message_id for m in drain(sqs, url)]
        if len(found) < expected:
            sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, VisibilityTimeout=0)
    return sorted(found)


def test_requeue_keeps_in_the_dlq_what_the_destination_refused(settings, clients):
    spec = ChannelSpec("orders", namespace=settings.namespace)
    resources = Provisioner(clients, settings).ensure_channel(spec)
    sqs = clients.client("sqs")
    ids = [f"job-{n}" for n in range(5)]
    dead_letters(sqs, resources.dlq.url, ids)
    refusal = RefusedEntries("SendMessageBatch", lambda entry: job_id(entry) == "job-2")
    with refusal.on(clients):
        report = Requeuer(spec.dlq_name, "orders", settings=settings, clients=clients,
                          visibility_timeout=2).start()
    assert [job_id(entry) for entry in refusal.refused] == ["job-2"]
    # Four moved, one refused and counted: the report says what happened
    assert (report.moved, report.failed) == (4, 1)
    assert receive_ids(sqs, resources.queue.url, 4) == ["job-0", "job-1", "job-3", "job-4"]
    # The refused dead letter is still in the DLQ (hidden until the move's hold ends), not lost
    assert held_and_visible(sqs, resources.dlq.url) == 1
    assert receive_ids(sqs, resources.dlq.url, 1) == ["job-2"]


def test_requeue_of_chosen_letters_keeps_a_refused_one(settings, clients):
    """The workbench's requeue (`messenger dlq requeue`) goes through the same move."""
    resources = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace))
    sqs = clients.client("sqs")
    dead_letters(sqs, resources.dlq.url, ["job-0", "job-1", "job-2"])
    refusal = RefusedEntries("SendMessageBatch", lambda entry: job_id(entry) == "job-1")
    with refusal.on(clients):
        reports = DeadLetterWorkbench("orders", settings, clients, visibility_timeout=2).requeue(
            ["job-0", "job-1", "job-2"])
    assert [(r.moved, r.failed) for r in reports] == [(2, 1)]
    assert receive_ids(sqs, resources.queue.url, 2) == ["job-0", "job-2"]
    assert receive_ids(sqs, resources.dlq.url, 1) == ["job-1"]


def test_a_refused_delete_is_not_counted_and_the_letter_stays(settings, clients, monkeypatch,
                                                              capsys):
    resources = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("orders", namespace=settings.namespace))
    sqs = clients.client("sqs")
    dead_letters(sqs, resources.dlq.url, ["job-0", "job-1", "job-2"])
    # The first entry of each DeleteMessageBatch is refused (a receipt handle SQS no longer takes)
    refusal = RefusedEntries("DeleteMessageBatch", lambda entry: entry["Id"] == "0",
                             code="ReceiptHandleIsInvalid")
    with refusal.on(clients):
        deleted = DeadLetterWorkbench("orders", settings, clients).delete(
            ["job-0", "job-1", "job-2"])
    assert len(refusal.refused) == 1
    assert deleted == 2
    # The refused letter is in the DLQ, visible again at once (not hidden till its hold ends)
    left = drain(sqs, resources.dlq.url)
    assert len(left) == 1 and decode(left[0]).message_id in {"job-0", "job-1", "job-2"}

    # The command says so and exits 1 (the hooks on the clients the command makes)
    dead_letters(sqs, resources.dlq.url, ["job-7", "job-8"])
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    made = CommandRuntime.from_env

    def refusing_runtime(*args: Any, **kwargs: Any) -> CommandRuntime:
        runtime = made(*args, **kwargs)
        refusal.register(runtime.clients)
        return runtime

    monkeypatch.setattr(CommandRuntime, "from_env", refusing_runtime)
    code = cli.main(["dlq", "delete", "orders", "job-7", "job-8", "--yes"])
    out = capsys.readouterr().out
    assert len(refusal.refused) == 2
    assert code == 1, out
    assert "deleted 1 of 2 message(s)" in out and "1 refused by SQS" in out
    assert len(drain(sqs, resources.dlq.url)) == 1
