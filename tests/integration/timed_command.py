"""`python -m tests.integration.timed_command ARGS`: the `messenger` command ARGS, as
`python -m messenger ARGS` runs it, which also writes to the file named by $TIMED_COMMAND_LOG
(JSON) when each of its AWS calls started and when each attempt of a call was sent, per thread,
the retry budget of each client factory it made, and when the command ended (its exit, before
the interpreter's own teardown).

Times are `time.monotonic()`: CLOCK_MONOTONIC, one clock for every process of the host, so the
test that started the command compares them with its own readings. This is how a test measures a
command from its own start (its first AWS call), not from the interpreter's: on a busy machine
starting Python and importing botocore takes seconds that are no part of any budget.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import time
from typing import Any

from messenger.aws import ClientFactory

LOG_VARIABLE = "TIMED_COMMAND_LOG"

#: thread name -> [call started, [attempt sent, ...]] for each call of that thread
calls: dict[str, list[list[Any]]] = {}
budgets: list[float] = []
_lock = threading.Lock()


def _call_started(**_: Any) -> None:
    with _lock:
        calls.setdefault(threading.current_thread().name, []).append([time.monotonic(), []])


def _attempt_sent(**_: Any) -> None:
    with _lock:
        thread_calls = calls.get(threading.current_thread().name)
        if thread_calls:
            thread_calls[-1][1].append(time.monotonic())


_made = ClientFactory.__init__


def _timed_init(self: ClientFactory, *args: Any, **kwargs: Any) -> None:
    """Every factory the command makes: its budget noted, its clients' calls and attempts
    timed (through `ClientFactory.register`, the public hook tests inject faults with)."""
    _made(self, *args, **kwargs)
    budgets.append(self.call_budget)
    self.register("before-call", _call_started)
    self.register("before-send", _attempt_sent)


def _write() -> None:
    ended = time.monotonic()
    with _lock, open(os.environ[LOG_VARIABLE], "w") as out:
        json.dump({"calls": calls, "budgets": budgets, "ended": ended}, out)


if __name__ == "__main__":
    ClientFactory.__init__ = _timed_init  # type: ignore[method-assign]
    atexit.register(_write)
    sys.argv = ["messenger", *sys.argv[1:]]
    runpy.run_module("messenger", run_name="__main__", alter_sys=True)
