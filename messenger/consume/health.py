"""The consumer's health file and `check_consumer_health`, the container's health check.

On every state transition (and, while PROCESSING, whenever a message finished since the last write)
the consumer writes `{"state", "since", "timeout_seconds", "pid", "consumer"}` to the health file
(`MESSENGER_HEALTH_FILE`, default /tmp/messenger-health.json) under a `filelock` lock, atomically.
`check_consumer_health` exits 1 when the consumer has been in a state with a limit
(INITIALIZING, INITIALIZED, PROCESSING, EXITING) for longer than `timeout_seconds`, or when the
file is unreadable; 0 otherwise, and 0 when there is no file yet (the consumer is starting).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from filelock import FileLock

DEFAULT_HEALTH_FILE = "/tmp/messenger-health.json"
HEALTH_FILE_VARIABLE = "MESSENGER_HEALTH_FILE"
#: States in which a consumer can be stuck; the others have no limit.
LIMITED_STATES = frozenset({"INITIALIZING", "INITIALIZED", "PROCESSING", "EXITING"})
#: Every state a consumer writes (`ConsumerState` values, exactly as written).
KNOWN_STATES = LIMITED_STATES | {"LISTENING", "IDLE", "EXITED"}
#: How far `since` may lie in the future (clock steps) before the file counts as corrupt.
CLOCK_SKEW_SECONDS = 5.0
LOCK_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class HealthRecord:
    """What the consumer last wrote: its state, since when, and how long that state may last."""

    state: str
    since: float
    timeout_seconds: float | None
    pid: int
    consumer: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "since": self.since,
            "timeout_seconds": self.timeout_seconds,
            "pid": self.pid,
            "consumer": self.consumer,
        }


@dataclass(frozen=True)
class HealthVerdict:
    healthy: bool
    reason: str


class HealthFile:
    """Reads and writes one health file; writes are atomic (temp file + rename) under a lock."""

    def __init__(self, path: str = DEFAULT_HEALTH_FILE) -> None:
        self.path = path
        self._lock = FileLock(path + ".lock", timeout=LOCK_TIMEOUT_SECONDS)

    def write(self, record: HealthRecord) -> None:
        directory = os.path.dirname(os.path.abspath(self.path))
        with self._lock:
            handle, temp = tempfile.mkstemp(prefix=".health-", dir=directory)
            try:
                with os.fdopen(handle, "w") as out:
                    json.dump(record.as_dict(), out)
                os.replace(temp, self.path)
            except BaseException:
                if os.path.exists(temp):
                    os.unlink(temp)
                raise

    def read(self) -> HealthRecord | None:
        """The record, or None when there is no file. Raises ValueError when it is malformed."""
        if not os.path.exists(self.path):
            return None
        with self._lock:
            try:
                with open(self.path) as source:
                    data = json.load(source)
            except FileNotFoundError:
                return None
            except ValueError as error:  # not JSON or not UTF-8: a torn or foreign write
                raise ValueError(f"health file {self.path} is malformed: {error}") from None
        try:
            record = _parse(data)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"health file {self.path} is malformed: {error}") from None
        return record

    def check(self, now: float | None = None) -> HealthVerdict:
        """Whether the consumer is healthy now (see the module docstring)."""
        try:
            record = self.read()
        except (ValueError, OSError) as error:
            return HealthVerdict(False, str(error))
        if record is None:
            return HealthVerdict(True, f"no health file at {self.path} yet: starting")
        now = time.time() if now is None else now
        elapsed = now - record.since
        if elapsed < -CLOCK_SKEW_SECONDS:  # a future `since` would never run out
            return HealthVerdict(
                False, f"health file {self.path} is malformed: since lies {-elapsed:.1f} s ahead"
            )
        if (
            record.state in LIMITED_STATES
            and record.timeout_seconds is not None
            and elapsed > record.timeout_seconds
        ):
            return HealthVerdict(
                False,
                f"{record.consumer} stuck in {record.state} for {elapsed:.1f} s "
                f"(limit {record.timeout_seconds:g} s)",
            )
        return HealthVerdict(True, f"{record.consumer} {record.state} for {elapsed:.1f} s")


def _parse(data: Any) -> HealthRecord:
    """A record from the file's JSON, refusing anything that could read as healthy by accident:
    an unknown (or lowercase) state, a NaN/inf time, a limited state without a finite limit."""
    state = data["state"]
    if state not in KNOWN_STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(sorted(KNOWN_STATES))}")
    since = _finite("since", data["since"])
    raw_timeout = data.get("timeout_seconds")
    timeout = None if raw_timeout is None else _finite("timeout_seconds", raw_timeout)
    if state in LIMITED_STATES and (timeout is None or timeout <= 0):
        raise ValueError(f"state {state} needs timeout_seconds > 0, got {raw_timeout!r}")
    return HealthRecord(
        state=state, since=since, timeout_seconds=timeout,
        pid=int(data.get("pid", 0)), consumer=str(data.get("consumer", "")),
    )


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def main(argv: Sequence[str] | None = None) -> int:
    """`check_consumer_health [--file F]`: exit 0 when healthy, 1 when stuck or unreadable."""
    parser = argparse.ArgumentParser(
        prog="check_consumer_health", description="health check of a messenger consumer"
    )
    parser.add_argument(
        "--file",
        default=os.environ.get(HEALTH_FILE_VARIABLE, DEFAULT_HEALTH_FILE),
        help=f"health file (default ${HEALTH_FILE_VARIABLE} or {DEFAULT_HEALTH_FILE})",
    )
    args = parser.parse_args(argv)
    verdict = HealthFile(args.file).check()
    print(("healthy: " if verdict.healthy else "unhealthy: ") + verdict.reason)
    return 0 if verdict.healthy else 1


if __name__ == "__main__":
    sys.exit(main())
