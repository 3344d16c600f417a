"""The status writer process (`messenger.jobs.status_writer`): a consumer's records written from a
child process, against the local endpoint: everything written at close, a signal to the child
does not stop it, a child that dies loses nothing (the consumer writes them itself)."""

from __future__ import annotations

import logging
import os
import signal
import time

from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.jobs.status_writer import StatusWriterProcess

EVENTS = (StatusEvent.RECEIVED, StatusEvent.STARTED, StatusEvent.COMPLETED)


def started_writer(clients, settings) -> tuple[StatusStore, StatusWriterProcess]:
    store = StatusStore(clients, settings)
    store.ensure_table()
    writer = StatusWriterProcess(store)
    writer.spawn()
    assert writer.wait_ready()
    return store, writer


def record_jobs(writer: StatusWriterProcess, first: int, count: int) -> None:
    for n in range(first, first + count):
        for step, event in enumerate(EVENTS):
            writer.record(StatusRecord(f"job{n}", event, "orders", at=1000.0 + n + step / 10))


def stored_events(clients, settings, jobs: range) -> dict[str, list[StatusEvent]]:
    reader = StatusStore(clients, settings)
    return {f"job{n}": [r.event for r in reader.timeline(f"job{n}")] for n in jobs}


def test_the_writer_process_writes_every_record_by_close(settings, clients):
    # Given a writer process and 60 jobs' records, the child interrupted (Ctrl-C reaches a
    # terminal's whole process group)
    store, writer = started_writer(clients, settings)
    record_jobs(writer, 0, 60)
    os.kill(writer.pid, signal.SIGINT)
    # When the consumer closes it
    writer.close(timeout=30)
    # Then the child wrote them all, a job's records in one item, and ended; the store's stats
    # count what it did
    assert not writer.failed_over
    assert (store.stats.recorded, store.stats.written, store.stats.items) == (180, 180, 60)
    assert store.stats.requests == 3 and store.stats.writer_cpu_seconds > 0
    assert all(events == list(EVENTS)
               for events in stored_events(clients, settings, range(60)).values())
    assert writer._process is not None and writer._process.poll() == 0


def test_a_writer_process_that_dies_loses_no_record(settings, clients, caplog):
    # Given a writer process that took 30 jobs' records
    store, writer = started_writer(clients, settings)
    record_jobs(writer, 0, 30)
    time.sleep(0.3)  # sent, maybe not written yet (held up to the 0.5 s flush interval)
    # When it is killed, and the consumer goes on recording
    with caplog.at_level(logging.ERROR, logger="messenger.status"):
        os.kill(writer.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not writer.failed_over and time.monotonic() < deadline:
            time.sleep(0.01)
        record_jobs(writer, 30, 30)
        writer.close(timeout=30)
    # Then the death is logged as an error and every job's records are in the table: what the
    # child had not acknowledged was written by the consumer's own thread
    assert writer.failed_over
    assert any("exited with -9" in r.getMessage() for r in caplog.records), caplog.text
    assert store.stats.recorded == 180 and store.stats.failed == 0
    for job, events in stored_events(clients, settings, range(60)).items():
        # (a record the child wrote just before it died may be there twice)
        assert set(events) == set(EVENTS), (job, events)


def test_records_wait_for_a_writer_process_that_is_slow_to_start(settings, clients):
    # Given a writer process not waited for (its imports take a while)
    store = StatusStore(clients, settings)
    store.ensure_table()
    writer = StatusWriterProcess(store)
    writer.spawn()
    # When records come at once and the writer is closed
    record_jobs(writer, 0, 5)
    writer.close(timeout=30)
    # Then they are written
    assert store.stats.written == 15 and not writer.failed_over
