"""Consumers of a channel that keeps results, run as real `messenger consume` processes by
tests/reliability/test_workflow_kills.py.

The handler appends one line to $WF_LEDGER per run ('<message id> <number of dependencies>',
flushed): a member has none, a group's callback one per member. With $WF_GO set, a member
waits until that file exists, so that the test lets every member finish at once.

$WF_KILL_AT_BARRIER kills the process with SIGKILL (kill -9: no handler, no atexit, no flush)
at its first barrier write (the workflows table's UpdateItem that counts a finished member,
seen on botocore's public `before-send` event): 'landed' after sending the request itself (the
write is applied, the answer never read), 'unsent' before it goes out.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from typing import Any

from messenger import Consumer, ReceivedMessage

CHANNEL = "wf_kill"


def kill_at_barrier(request: Any, **_: Any) -> None:
    """botocore hook: SIGKILL this process at the first barrier write ('DELETE pending')."""
    body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
    if b"DELETE pending" not in body:
        return
    if os.environ.get("WF_KILL_AT_BARRIER") == "landed":
        forwarded = urllib.request.Request(request.url, data=body, method=request.method,
                                           headers=dict(request.headers))
        with urllib.request.urlopen(forwarded) as answer:
            answer.read()
    os.kill(os.getpid(), signal.SIGKILL)


class Members(Consumer):
    """Runs members ({"n": n} → n) and callbacks; a 2 s lease, so a killed run comes back fast."""

    channel = CHANNEL
    track_status = True
    keep_results = True
    visibility_timeout = 2
    processing_timeout = 60
    max_receives = 10
    concurrency = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if os.environ.get("WF_KILL_AT_BARRIER"):
            self.clients.register("before-send.dynamodb.UpdateItem", kill_at_barrier)

    def handler(self, message: ReceivedMessage) -> Any:
        go = os.environ.get("WF_GO")
        if go and "n" in message.body:
            while not os.path.exists(go):
                time.sleep(0.01)
        with open(os.environ["WF_LEDGER"], "a") as ledger:
            ledger.write(f"{message.message_id} {len(message.dependencies)}\n")
        return message.body.get("n")


class SlowLeaseMembers(Members):
    """The same with a 30 s lease: 50 members held at once are not handed out twice."""

    visibility_timeout = 30
