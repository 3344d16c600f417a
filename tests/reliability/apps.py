"""Consumers the reliability suite runs as real `messenger consume` processes.

The handler appends the message id to $RELIABILITY_LEDGER (one line, flushed) before it returns,
so the test knows what was processed, how often, even when the process is killed right after.
$RELIABILITY_THROTTLE (0..1) throttles that share of the process's SendMessage(Batch),
ReceiveMessage, DeleteMessage(Batch) and ChangeMessageVisibility(Batch) requests with the real
SQS throttling error (tests.faults.Throttle); the counts go to $RELIABILITY_FAULTS at exit.
$RELIABILITY_WAIT_SECONDS (0..20) is the consumer's long poll (ConsumerSettings.wait_time_seconds;
default 20), for a test that waits until a poll in flight has answered.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import Any

from messenger import Consumer, LifecycleHooks, ReceivedMessage, register_hook
from tests.faults import Throttle

CHANNEL = "reliability"
SQS_OPERATIONS = frozenset({
    "SendMessage", "SendMessageBatch", "ReceiveMessage", "DeleteMessage", "DeleteMessageBatch",
    "ChangeMessageVisibility", "ChangeMessageVisibilityBatch",
})


def append_line(variable: str, line: str) -> None:
    with open(os.environ[variable], "a") as out:
        out.write(line + "\n")


class LedgerConsumer(Consumer):
    """Records each processed message id. Body: {"sleep": s} sleeps first, {"poison": true}
    always raises; a 2 s lease, so a killed consumer's messages come back fast."""

    channel = CHANNEL
    visibility_timeout = 2
    processing_timeout = 30
    #: Seconds before a failed message is visible again (the library's default is 5).
    retry_delay = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runtime = replace(self.runtime, retry_delay=self.retry_delay)
        if os.environ.get("RELIABILITY_WAIT_SECONDS"):
            self.runtime = replace(self.runtime,
                                   wait_time_seconds=int(os.environ["RELIABILITY_WAIT_SECONDS"]))
        self.throttle: Throttle | None = None
        rate = float(os.environ.get("RELIABILITY_THROTTLE") or 0)
        if rate:
            self.throttle = Throttle(rate, set(SQS_OPERATIONS), seed=os.getpid())
            self.clients.register("before-send", self.throttle)

    def handler(self, message: ReceivedMessage) -> None:
        body = message.body if isinstance(message.body, dict) else {}
        if body.get("poison"):
            append_line("RELIABILITY_ATTEMPTS", json.dumps(
                {"message_id": message.message_id, "receive_count": message.receive_count}))
            raise ValueError("poison message")
        if body.get("sleep"):
            time.sleep(float(body["sleep"]))
        append_line("RELIABILITY_LEDGER", message.message_id)

    @register_hook(LifecycleHooks.EXITED)
    def report_faults(self, previous: Any) -> None:
        if self.throttle is not None and os.environ.get("RELIABILITY_FAULTS"):
            append_line("RELIABILITY_FAULTS", json.dumps(
                {"injected": self.throttle.injected, "passed": self.throttle.passed}))


class TimeoutLedgerConsumer(LedgerConsumer):
    """LedgerConsumer with a 1 s processing timeout: {"sleep": 2.5} is dead-lettered."""

    processing_timeout = 1


class AttemptsConsumer(LedgerConsumer):
    """Appends each run's start to $RELIABILITY_ATTEMPTS before anything else. Body:
    {"fail_first": n} fails the first n receives; {"sleep": s} then sleeps s seconds (a run to
    kill in the middle).

    Its channel's redrive waits for 10 receives, well above the attempts the tests give: a
    killed consumer's long poll still in flight takes the message once more when its lease
    lapses, and with max_receives equal to max_attempts SQS's redrive would then move it to the
    DLQ, without a reason, before the next consumer sees it."""

    max_receives = 10

    def handler(self, message: ReceivedMessage) -> None:
        append_line("RELIABILITY_ATTEMPTS", json.dumps(
            {"message_id": message.message_id, "receive_count": message.receive_count}))
        body = message.body if isinstance(message.body, dict) else {}
        if message.receive_count <= int(body.get("fail_first", 0)):
            raise ValueError("a failing attempt")
        time.sleep(float(body.get("sleep", 0)))
        append_line("RELIABILITY_LEDGER", message.message_id)


class TrackedAttemptsConsumer(AttemptsConsumer):
    """AttemptsConsumer recording its jobs' timelines in the status table."""

    track_status = True
