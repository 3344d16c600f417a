"""A consumer of a channel that keeps results, run as a real `messenger consume` process by
tests/integration/test_results.py.

The handler appends the message id to $RESULTS_LEDGER (one line, flushed) and returns
{"doubled": 2n}. With $RESULTS_KILL_BEFORE_FINISH set, the process kills itself with SIGKILL
(kill -9: no handler, no atexit, no flush) when it is about to send its first final-outcome
write (`ResultStore.finish`'s UpdateItem, seen by a botocore `provide-client-params` hook, a
public event): after the handler returned and before anything of its outcome was written.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from messenger import Consumer, ReceivedMessage
from messenger.jobs.results import FINAL_SK

CHANNEL = "results_kill"


def kill_before_finish(params: dict[str, Any], **_: Any) -> None:
    """botocore hook: SIGKILL this process before an UpdateItem that writes a final outcome."""
    key = params.get("Key") or {}
    writes_outcome = "#outcome" in (params.get("ExpressionAttributeNames") or {})
    if key.get("sk", {}).get("S") == FINAL_SK and writes_outcome:
        os.kill(os.getpid(), signal.SIGKILL)


class DoublingConsumer(Consumer):
    """Returns {"doubled": 2n} for {"n": n}; a 2 s lease, so a killed run comes back fast."""

    channel = CHANNEL
    track_status = True
    keep_results = True
    visibility_timeout = 2
    processing_timeout = 30
    max_receives = 10

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if os.environ.get("RESULTS_KILL_BEFORE_FINISH"):
            self.clients.register("provide-client-params.dynamodb.UpdateItem",
                                  kill_before_finish)

    def handler(self, message: ReceivedMessage) -> dict[str, int]:
        with open(os.environ["RESULTS_LEDGER"], "a") as ledger:
            ledger.write(message.message_id + "\n")
        return {"doubled": 2 * int(message.body["n"])}
