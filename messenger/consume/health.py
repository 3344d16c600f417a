"""The consumer's health file and `check_consumer_health`, the container's health check.

The consumer writes `{"state", "since", "timeout_seconds", "pid", "consumer", "written_at",
"refresh_seconds"}` to its health file atomically, under a `filelock` lock: on every state
transition (between LISTENING, IDLE and PROCESSING within a second), and every `refresh_seconds`
(default DEFAULT_REFRESH_SECONDS) whatever it is doing, from a thread of its own, from
INITIALIZING until it has EXITED. Times are seconds on the host's boot clock (`health_clock`:
CLOCK_BOOTTIME on Linux, CLOCK_MONOTONIC elsewhere): every process of the host reads the same
clock, and wall-clock steps (NTP, a manual `date`) do not move it.

`check_consumer_health` exits 0 only when it can tell the consumer is fine, else 1 with one line
saying why:
- the file exists and is well-formed (no file: not started yet, or it cannot write there; the
  ECS health check's start period covers a consumer's start);
- the process that wrote it (`pid`, in the checker's PID namespace: the container's) is alive,
  and started before the file was written (else the pid was reused: the writer is gone);
- a file can be written in its directory (the checker tries: a full or read-only filesystem
  fails the check at once, named as such, before its effect, a file its writer can no longer
  refresh, shows);
- it was written within STALE_REFRESHES refresh intervals: a hung process, one that stays up
  after EXITED, or a consumer whose writes keep failing leave it stale;
- the state is within its limit: INITIALIZING/INITIALIZED, PROCESSING and EXITING have one
  (`timeout_seconds`), LISTENING, IDLE and PAUSED have none.

The file is `MESSENGER_HEALTH_FILE` when set, else one per consumer class in the temporary
directory (`default_health_file`): two consumers on one host do not share one. Without `--file`
and without the variable, the check looks at every such default file there whose writer still
runs: a file left by a consumer that has ended (exited cleanly after EXITED, or killed), e.g. by
an earlier run or a test on a developer's machine, is listed as not counted and does not fail
the check; with no running consumer's file at all the check fails (nothing to vouch for).
"""

from __future__ import annotations

import argparse
import errno
import glob
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

HEALTH_FILE_VARIABLE = "MESSENGER_HEALTH_FILE"
#: Name of a consumer's default health file in the temporary directory; `{}`: module.Class.
DEFAULT_HEALTH_NAME = "messenger-health-{}.json"
#: States in which a consumer can be stuck; the others have no limit.
LIMITED_STATES = frozenset({"INITIALIZING", "INITIALIZED", "PROCESSING", "EXITING"})
#: Every state a consumer writes (`ConsumerState` values, exactly as written).
KNOWN_STATES = LIMITED_STATES | {"LISTENING", "IDLE", "PAUSED", "EXITED"}
#: How far `since` or `written_at` may lie in the future before the file counts as corrupt.
CLOCK_SKEW_SECONDS = 5.0
LOCK_TIMEOUT_SECONDS = 5.0
#: How often a consumer rewrites its health file by default, and the limits of that setting.
DEFAULT_REFRESH_SECONDS = 5.0
MIN_REFRESH_SECONDS = 0.1
MAX_REFRESH_SECONDS = 60.0
#: A file not rewritten for this many refresh intervals is stale: its writer is gone or hung.
STALE_REFRESHES = 3
#: A process that started this long after a file was last written is not its writer (its pid
#: was reused): /proc gives start times in clock ticks, this covers their rounding.
PID_REUSE_TOLERANCE_SECONDS = 1.0

_CLOCK_ID = getattr(time, "CLOCK_BOOTTIME", getattr(time, "CLOCK_MONOTONIC", None))


def health_clock() -> float:
    """Seconds on the host's boot clock: the same in every process, unmoved by wall-clock
    steps (CLOCK_BOOTTIME on Linux, CLOCK_MONOTONIC elsewhere)."""
    if _CLOCK_ID is None:  # no clock_gettime (Windows): this process's monotonic clock
        return time.monotonic()
    return time.clock_gettime(_CLOCK_ID)


def default_health_file(consumer: str) -> str:
    """The health file of consumer class `consumer` ('module.Class') when none is set."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in consumer)
    return os.path.join(tempfile.gettempdir(), DEFAULT_HEALTH_NAME.format(safe))


def default_health_files() -> str:
    """The glob pattern of every consumer's default health file."""
    return os.path.join(tempfile.gettempdir(), DEFAULT_HEALTH_NAME.format("*"))


@dataclass(frozen=True)
class HealthRecord:
    """What the consumer last wrote: its state, since when, how long that state may last, and
    when it wrote it (times on `health_clock`)."""

    state: str
    since: float
    timeout_seconds: float | None
    pid: int
    consumer: str
    written_at: float
    refresh_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "since": self.since,
            "timeout_seconds": self.timeout_seconds,
            "pid": self.pid,
            "consumer": self.consumer,
            "written_at": self.written_at,
            "refresh_seconds": self.refresh_seconds,
        }


@dataclass(frozen=True)
class HealthVerdict:
    healthy: bool
    reason: str


class HealthFile:
    """Reads and writes one health file; writes are atomic (temp file + rename) under a lock.
    Nothing creates its directory: a directory that does not exist is an error."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))
        self._lock = FileLock(path + ".lock", timeout=LOCK_TIMEOUT_SECONDS)

    def check_directory(self) -> None:
        """Raise FileNotFoundError when the file's directory does not exist (filelock would
        create it)."""
        if not os.path.isdir(self.directory):
            raise FileNotFoundError(errno.ENOENT, "directory does not exist", self.directory)

    def write(self, record: HealthRecord) -> None:
        self.check_directory()
        with self._lock:
            handle, temp = tempfile.mkstemp(prefix=".health-", dir=self.directory)
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
        self.check_directory()
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

    def probe_write(self) -> str | None:
        """Try writing a file next to the health file as its writer would (then remove it):
        the error, or None when that works."""
        try:
            handle, temp = tempfile.mkstemp(prefix=".health-probe-", dir=self.directory)
        except OSError as error:
            return f"{error.strerror or error}"
        try:
            with os.fdopen(handle, "w") as out:
                out.write(" " * 512)  # a record's size: a full filesystem refuses the data
                out.flush()
            return None
        except OSError as error:
            return f"{error.strerror or error}"
        finally:
            os.unlink(temp)

    def check(self, now: float | None = None) -> HealthVerdict:
        """Whether the consumer is healthy now (see the module docstring); `now` on
        `health_clock` (default: read it)."""
        try:
            record = self.read()
        except (ValueError, OSError) as error:
            return HealthVerdict(False, str(error))
        if record is None:
            return HealthVerdict(False, f"no health file at {self.path}: the consumer has not "
                                        f"written one (not started, or it cannot write there)")
        now = health_clock() if now is None else now
        name = record.consumer
        if not writer_running(record):
            return HealthVerdict(False, f"{name} (pid {record.pid}) is not running; it last "
                                        f"wrote {record.state}")
        # The directory first: a full or read-only filesystem is the cause, the stale file
        # its writer can no longer refresh only its effect.
        problem = self.probe_write()
        if problem is not None:
            return HealthVerdict(False, f"{name} cannot write its health file: {self.directory}: "
                                        f"{problem}")
        age = now - record.written_at
        stale_after = STALE_REFRESHES * record.refresh_seconds
        if age > stale_after:
            return HealthVerdict(False, f"{name} has not refreshed {self.path} for {age:.1f} s "
                                        f"(every {record.refresh_seconds:g} s expected): hung, "
                                        f"or its writes fail; it last wrote {record.state}")
        elapsed = now - record.since
        if min(elapsed, age) < -CLOCK_SKEW_SECONDS:  # a future time would never run out
            return HealthVerdict(
                False, f"health file {self.path} is malformed: its times lie "
                       f"{-min(elapsed, age):.1f} s ahead of the boot clock"
            )
        if (
            record.state in LIMITED_STATES
            and record.timeout_seconds is not None
            and elapsed > record.timeout_seconds
        ):
            return HealthVerdict(
                False,
                f"{name} stuck in {record.state} for {elapsed:.1f} s "
                f"(limit {record.timeout_seconds:g} s)",
            )
        return HealthVerdict(True, f"{name} {record.state} for {elapsed:.1f} s")


    def writer_gone(self) -> str | None:
        """Why the file's writer no longer runs ('app.Consumer (pid 42) exited cleanly'), or
        None when it runs, or when the file cannot be read (then `check` says why)."""
        try:
            record = self.read()
        except (ValueError, OSError):
            return None
        if record is None or writer_running(record):
            return None
        how = "exited cleanly" if record.state == "EXITED" else \
            f"is not running (it last wrote {record.state})"
        return f"{record.consumer} (pid {record.pid}) {how}"


def writer_running(record: HealthRecord) -> bool:
    """Whether the process that wrote `record` still runs: its pid is alive and that process
    started before the record was written (a later one reuses the pid of a writer that
    ended)."""
    if not process_alive(record.pid):
        return False
    started = process_started(record.pid)
    return started is None or started <= record.written_at + PID_REUSE_TOLERANCE_SECONDS


def process_started(pid: int) -> float | None:
    """When process `pid` started, in seconds on `health_clock` (Linux: /proc/<pid>/stat's
    starttime, clock ticks since boot, the boot clock's); None where that is unknown."""
    if _CLOCK_ID != getattr(time, "CLOCK_BOOTTIME", None):
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (in this PID namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux): kill(0) said it exists
        return True


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
    pid = data["pid"]
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ValueError(f"pid must be a process id, got {pid!r}")
    refresh = _finite("refresh_seconds", data["refresh_seconds"])
    if refresh <= 0:
        raise ValueError(f"refresh_seconds must be > 0, got {refresh!r}")
    return HealthRecord(
        state=state, since=since, timeout_seconds=timeout, pid=pid,
        consumer=str(data.get("consumer", "")),
        written_at=_finite("written_at", data["written_at"]), refresh_seconds=refresh,
    )


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def main(argv: Sequence[str] | None = None) -> int:
    """`check_consumer_health [--file F]`: exit 0 when healthy, 1 when not or when it cannot
    tell. Without --file: $MESSENGER_HEALTH_FILE, else the default file of every consumer that
    still runs (those of consumers that ended are listed, not counted)."""
    parser = argparse.ArgumentParser(
        prog="check_consumer_health", description="health check of a messenger consumer"
    )
    parser.add_argument(
        "--file", default=os.environ.get(HEALTH_FILE_VARIABLE) or None,
        help=f"health file (default ${HEALTH_FILE_VARIABLE}, else every "
             f"{default_health_files()})",
    )
    args = parser.parse_args(argv)
    paths = [args.file] if args.file else sorted(glob.glob(default_health_files()))
    if not paths:
        print(f"unhealthy: no health file at {default_health_files()}: no consumer has "
              f"written one (not started, or it cannot write there)")
        return 1
    if not args.file:  # every default file: only those of consumers that still run count
        live = []
        for path in paths:
            gone = HealthFile(path).writer_gone()
            if gone is None:
                live.append(path)
            else:
                print(f"not counted: {path}: {gone}")
        if not live:
            print(f"unhealthy: no running consumer's health file at {default_health_files()} "
                  f"({len(paths)} left by consumers that ended)")
            return 1
        paths = live
    verdicts = [HealthFile(path).check() for path in paths]
    for verdict in verdicts:
        print(("healthy: " if verdict.healthy else "unhealthy: ") + verdict.reason)
    return 0 if all(verdict.healthy for verdict in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
