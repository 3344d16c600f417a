"""A status store's writer in a child process: the consumer only hands records over a pipe.

`StatusStore` writes from a thread of the process that records. In a consumer whose handlers
are short that thread's CPU (building, signing, sending and parsing one BatchWriteItem per 25
jobs, under the GIL) is taken from the handlers: status tracking cost a fifth of the throughput
(bench/RESULTS.md, "Status tracking at full speed"). `StatusWriterProcess` runs the same store in
a child process (`python -m messenger.jobs.status_writer`): the consumer appends each record to a
list, and a sender thread pickles what gathered every SEND_INTERVAL seconds into one frame on the
child's stdin. The child records them in its own `StatusStore`, which groups and writes them as
in a thread (one item per job, 25 per request), and answers on its stdout with acknowledgements:
the frames whose every record is written (or counted as failed), and its counts.

Opt-in (MESSENGER_STATUS_WRITER=process): it pays where the consumer's task has a core to spare
for the writer: on a quiet 2-core machine, empty handlers ran at 0.875 of untracked throughput
with it against 0.816 with the thread. It does not make the writing cheaper (pickling both ways
adds a little CPU), and on a machine whose cores were all busy it measured no faster than the
thread (bench/RESULTS.md, "Status tracking at full speed").

Nothing is lost on the way:
- close(timeout) sends what is left and closes the child's stdin; the child writes everything
  and exits; the consumer waits for it at most `timeout` (its shutdown cap), then kills it and
  logs how many records were not written.
- The child ignores SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process group): it
  ends when its stdin does, i.e. when the consumer closes it or dies.
- A child that dies (or cannot start) is logged as an error, and the store writes from a thread
  of the consumer again: the records it held that were not acknowledged are recorded there (a
  record written just before the crash may then be written twice; none is missing).

The records a frame carries and the acknowledgements are pickled: both ends are this module, in
the same interpreter and version of messenger.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import IO, Any

from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore

logger = logging.getLogger("messenger.status")

#: Seconds between the consumer's frames to the writer process (the child holds a job's records
#: up to the store's flush interval anyway, to write them as one item).
SEND_INTERVAL = 0.1
#: Records that make the sender send at once.
SEND_RECORDS = 500
#: Seconds start() waits for the child to have made its DynamoDB client (imports included), so
#: that it does not do so beside the first handlers; it goes on without it after this.
READY_SECONDS = 10.0
_HEADER = struct.Struct("!I")

#: StatusRecord's fields in the order a frame carries them (a tuple pickles in a tenth of a
#: dataclass's time).
_FIELDS = ("message_id", "event", "channel", "at", "consumer_id", "receive_count", "duration",
           "error_class", "error", "traceback", "due_at", "actor")


def _as_tuple(r: StatusRecord) -> tuple[Any, ...]:
    return (r.message_id, r.event.value, r.channel, r.at, r.consumer_id, r.receive_count,
            r.duration, r.error_class, r.error, r.traceback, r.due_at, r.actor)


def _from_tuple(values: tuple[Any, ...]) -> StatusRecord:
    # no zip(strict=): messenger/jobs ships to EMR nodes' Python 3.9 (tests/unit/test_emr_python)
    if len(values) != len(_FIELDS):
        raise ValueError(f"a status record has {len(_FIELDS)} fields, got {len(values)}")
    fields = dict(zip(_FIELDS, values))
    fields["event"] = StatusEvent(fields["event"])
    return StatusRecord(**fields)


def _send(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


class StatusWriterProcess:
    """The front of a `StatusStore` whose writing runs in a child process (see the module doc).

    store: the consumer's store (its table, retention and flush interval go to the child, its
    `stats` count what the child did; it writes itself again if the child dies). send_interval:
    seconds between frames (SEND_INTERVAL).
    """

    def __init__(self, store: StatusStore, send_interval: float = SEND_INTERVAL) -> None:
        self.store = store
        self.send_interval = send_interval
        self._records: list[tuple[Any, ...]] = []
        #: (frame number, its records) sent and not acknowledged yet, oldest first
        self._unacknowledged: deque[tuple[int, list[tuple[Any, ...]]]] = deque()
        self._held = 0  # records in _records and _unacknowledged
        self._frames = 0
        self._child_counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._done = threading.Event()  # the child said it wrote everything
        self._ready = threading.Event()
        #: True once the child died: records go to the store's own thread
        self.failed_over = False
        self._process: subprocess.Popen[bytes] | None = None
        self._sender: threading.Thread | None = None
        self._reader: threading.Thread | None = None

    # -- start ----------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the child (it imports and makes its client meanwhile: see `wait_ready`).
        Raises OSError when it cannot be started (the caller keeps the thread)."""
        store = self.store
        clients = store.clients
        config = {
            "settings": store.settings, "region": clients.region,
            "endpoint_url": clients.endpoint_url, "call_timeout": clients.call_timeout,
            "call_budget": clients.call_budget, "retention_seconds": store.retention_seconds,
            "flush_interval": store.flush_interval,
        }
        # messenger as this process imported it (a checkout on sys.path, not installed): the
        # folder above messenger/jobs/ holding this module
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "messenger.jobs.status_writer"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            env={**os.environ, "PYTHONPATH": path},
        )
        assert self._process.stdin is not None
        _send(self._process.stdin, config)
        self._reader = threading.Thread(target=self._read, name="messenger-status-acks",
                                        daemon=True)
        self._reader.start()
        self._sender = threading.Thread(target=self._send_loop, name="messenger-status-send",
                                        daemon=True)
        self._sender.start()

    @property
    def pid(self) -> int | None:
        """The child's process id (None before `spawn`)."""
        return None if self._process is None else self._process.pid

    def wait_ready(self, timeout: float = READY_SECONDS) -> bool:
        """Wait (at most `timeout` seconds) until the child is ready to write, or gone."""
        return self._ready.wait(timeout)

    # -- the consumer's side ----------------------------------------------------------------
    def record(self, record: StatusRecord) -> None:
        """Queue a record for the child; never blocks on it, never raises."""
        if self.failed_over or self._closing:  # (a late event: the store's thread writes it)
            self.store.record(record)
            return
        with self._lock:
            stats = self.store.stats
            stats.recorded += 1
            if self._held >= self.store.max_buffer:
                stats.dropped += 1
                return
            self._records.append(_as_tuple(record))
            self._held += 1
            full = len(self._records) >= SEND_RECORDS
        if full:
            self._wake.set()

    def _send_loop(self) -> None:
        process = self._process
        assert process is not None and process.stdin is not None
        while True:
            self._wake.wait(self.send_interval)
            self._wake.clear()
            with self._lock:
                closing, records, self._records = self._closing, self._records, []
                if records:
                    self._frames += 1
                    self._unacknowledged.append((self._frames, records))
            try:
                if records:
                    _send(process.stdin, records)
                if closing:
                    process.stdin.close()  # the child writes everything and exits
                    return
            except (OSError, ValueError):  # the child is gone: the reader fails over
                return

    def _read(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None
        while True:
            try:
                message = _receive(process.stdout)
            except Exception:  # a torn frame: the child died writing it
                message = None
            if message is None:
                break
            kind, frame, counts = message
            self._count(counts)
            if kind == "ready":
                self._ready.set()
                continue
            with self._lock:
                while self._unacknowledged and self._unacknowledged[0][0] <= frame:
                    self._held -= len(self._unacknowledged.popleft()[1])
            if kind == "done":
                self._done.set()
        code = process.wait()
        self._ready.set()
        if not self._done.is_set():
            self._fail_over(f"the status writer process exited with {code}")

    def _count(self, counts: dict[str, Any]) -> None:
        """Add what the child did since its last message to the store's stats."""
        stats = self.store.stats
        for name in ("written", "failed", "dropped", "requests", "items"):
            value = counts[name]
            setattr(stats, name, getattr(stats, name) + value - self._child_counts.get(name, 0))
            self._child_counts[name] = value
        stats.writer_cpu_seconds = counts["cpu_seconds"]

    def _fail_over(self, why: str) -> None:
        """The child is gone: record what it did not acknowledge in the store's own thread."""
        with self._lock:
            if self.failed_over:
                return
            self.failed_over = True
            held = [r for _, records in self._unacknowledged for r in records] + self._records
            self._unacknowledged.clear()
            self._records = []
            self._held = 0
        logger.error("%s; writing status records in this process (%d record(s) taken back)",
                     why, len(held))
        self.store.stats.recorded -= len(held)  # the store counts them again
        for values in held:
            self.store.record(_from_tuple(values))

    # -- the end --------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> None:
        """Send what is left, let the child write everything and wait for it at most
        `timeout` seconds (None: until it is done); then kill it and log what it did not
        write. After a fail-over, the store's own close within what is left of `timeout`."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._lock:
            self._closing = True
        self._wake.set()
        if self._reader is not None:
            self._reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self.failed_over or self._process is None:
            self.store.close(None if deadline is None else deadline - time.monotonic())
            return
        if not self._done.is_set():
            with self._lock:
                left = self._held
            logger.warning("status store: the writer process did not end within %.1f s; %d "
                           "record(s) not written", timeout, left)
            self._process.kill()
            self._process.wait()


# -- the child --------------------------------------------------------------------------------
class _ChildStore(StatusStore):
    """The child's store: acknowledges each frame once its records are written."""

    def __init__(self, *args: Any, out: IO[bytes], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._out = out
        self._out_lock = threading.Lock()
        self._frame_of: dict[int, int] = {}  # id(record) -> its frame
        self._left: dict[int, int] = {}  # frame -> its records not written yet
        self._acknowledged = 0
        self._frames_lock = threading.Lock()

    def take(self, frame: int, records: list[StatusRecord]) -> None:
        with self._frames_lock:
            if records:
                self._left[frame] = len(records)
                for record in records:
                    self._frame_of[id(record)] = frame
            else:
                self._left[frame] = 0
        for record in records:
            self.record(record)
        if not records:
            self._acknowledge()

    def _write(self, batch: list[StatusRecord]) -> None:
        try:
            super()._write(batch)
        finally:  # written, or counted as failed
            with self._frames_lock:
                for record in batch:
                    frame = self._frame_of.pop(id(record))
                    self._left[frame] -= 1
            self._acknowledge()

    def _acknowledge(self, kind: str = "ack") -> None:
        with self._frames_lock:
            frame = self._acknowledged
            while self._left.get(frame + 1) == 0:
                frame += 1
                del self._left[frame]
            self._acknowledged = frame
        self.tell(kind, frame)

    def tell(self, kind: str, frame: int | None = None) -> None:
        counts = {**asdict(self.stats), "cpu_seconds": time.process_time()}
        with self._out_lock:
            _send(self._out, (kind, self._acknowledged if frame is None else frame, counts))


def main() -> int:
    """The writer process: a config message, then frames of records until stdin ends."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # it ends when the consumer closes its stdin
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the acknowledgements
    config = _receive(stdin)
    if config is None:
        return 1
    from messenger.aws import ClientFactory

    clients = ClientFactory(config["region"], endpoint_url=config["endpoint_url"],
                            call_timeout=config["call_timeout"],
                            call_budget=config["call_budget"])
    store = _ChildStore(clients, config["settings"],
                        retention_seconds=config["retention_seconds"],
                        flush_interval=config["flush_interval"],
                        max_buffer=sys.maxsize,  # the consumer bounds what it sends
                        out=stdout)
    store.prepare(check_table=False)  # the consumer made sure of the table
    store.tell("ready")
    frame = 0
    while True:
        records = _receive(stdin)
        if records is None:
            break
        frame += 1
        store.take(frame, [_from_tuple(values) for values in records])
    store.close()
    store.tell("done")
    return 0


if __name__ == "__main__":
    os._exit(main())  # daemon threads, buffered stdio: all written already
