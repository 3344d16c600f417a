"""A consumer's status tracking: its lifecycle events as `StatusRecord`s in the status store.

The consumer emits the same lifecycle events whether tracking is on or off (they always go to the
JSON log); with `track_status` on, `StatusTracker.track` also turns the message events into status
records, keyed by the producer's message id, so that `messenger status <id>` shows QUEUED (the
producer) through COMPLETED in one timeline. Writing happens in the store's background thread, or,
for a Fargate consumer with ConsumerSettings.status_writer 'process', in a writer process of its
own (`messenger.jobs.status_writer`): the consumer then only hands records over a pipe. A store
that fails is logged and counted there, never a reason to fail or hold up a message.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from messenger.consume.lifecycle import LifecycleEvent
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore

if TYPE_CHECKING:
    from messenger.jobs.status_writer import StatusWriterProcess

logger = logging.getLogger("messenger.consumer")

#: Lifecycle event name → status event. 'released' (shutdown) and warnings are log-only.
STATUS_EVENTS: dict[str, StatusEvent] = {
    "received": StatusEvent.RECEIVED,
    "started": StatusEvent.STARTED,
    "completed": StatusEvent.COMPLETED,
    "failed": StatusEvent.FAILED,
    "retried": StatusEvent.RETRIED,
    "timed_out": StatusEvent.TIMED_OUT,
    "cancelled": StatusEvent.CANCELLED,
    "dead_lettered": StatusEvent.DEAD_LETTERED,
}


def consumer_id(environ: Mapping[str, str] | None = None) -> str:
    """A stable id of this consumer process: MESSENGER_CONSUMER_ID, else the ECS task id (from
    the task metadata endpoint's URL), else '<hostname>-<pid>'."""
    env = os.environ if environ is None else environ
    explicit = env.get("MESSENGER_CONSUMER_ID")
    if explicit:
        return explicit
    metadata = env.get("ECS_CONTAINER_METADATA_URI_V4", "")
    if metadata:
        # Fargate: http://169.254.170.2/v4/<task id>-<container number>
        last = metadata.rstrip("/").rsplit("/", 1)[-1]
        task = last.split("-", 1)[0]
        if task:
            return f"ecs-{task}-{os.getpid()}"
    return f"{socket.gethostname()}-{os.getpid()}"


def status_record(event: LifecycleEvent, consumer: str) -> StatusRecord | None:
    """The status record of a message's lifecycle event (None for other events)."""
    status = STATUS_EVENTS.get(event.name)
    if status is None or event.message_id is None:
        return None
    fields: dict[str, Any] = event.fields
    error_class, error, trace = "", "", ""
    if status is StatusEvent.FAILED:
        error_class = str(fields.get("error_class", ""))
        error = str(fields.get("error", "")).removeprefix(f"{error_class}: ")
        trace = str(fields.get("traceback", ""))
    elif status is StatusEvent.DEAD_LETTERED:
        error = str(fields.get("reason", ""))
    elif status is StatusEvent.TIMED_OUT:
        error_class = "ProcessingTimeout"
        error = f"exceeded {fields.get('processing_timeout')} s"
    actor = ""
    if status is StatusEvent.CANCELLED:
        actor = str(fields.get("by", ""))
        error = f"cancelled by {actor}"
    return StatusRecord(
        message_id=event.message_id,
        event=status,
        channel=event.channel,
        at=event.at,
        consumer_id=consumer,
        receive_count=int(fields.get("receive_count") or 0),
        duration=event.duration,
        error_class=error_class,
        error=error,
        traceback=trace,
        actor=actor,
    )


class StatusTracker:
    """Records a consumer's message events in a `StatusStore` (see the module doc)."""

    def __init__(self, store: StatusStore, consumer: str | None = None) -> None:
        self.store = store
        self.consumer_id = consumer or consumer_id()
        #: The writer process in front of `store` (start(writer_process=True)), else None.
        self.writer: StatusWriterProcess | None = None

    def start(self, writer_process: bool = False) -> None:
        """Create (auto) or check (verify) the status table; a failure is only logged: records
        are retried by the writer, and messages never wait for them. writer_process: write from
        a child process (the Fargate runtime; False: from a thread, as Lambda does, which flushes
        at the end of each invocation); one that cannot start is logged, and the thread used."""
        if writer_process:
            from messenger.jobs.status_writer import StatusWriterProcess

            writer = StatusWriterProcess(self.store)
            try:
                writer.spawn()
            except OSError as error:
                logger.error("the status writer process did not start (%s: %s); writing status "
                             "records in this process", type(error).__name__, error)
            else:
                self.writer = writer
        try:
            if self.writer is None:
                self.store.prepare()
            else:  # the writer process makes its client; this process's is made if it dies
                self.store.ensure_table()
        except Exception as error:
            logger.warning("status table %s not ready: %s: %s", self.store.table,
                           type(error).__name__, error)
        if self.writer is not None:
            self.writer.wait_ready()

    @property
    def _sink(self) -> StatusStore | StatusWriterProcess:
        """Where records go: the writer process when there is one, else the store's thread."""
        return self.store if self.writer is None else self.writer

    def record(self, record: StatusRecord) -> None:
        """Queue a record for writing (the writer process's, else the store's thread)."""
        self._sink.record(record)

    def track(self, event: LifecycleEvent) -> None:
        record = status_record(event, self.consumer_id)
        if record is not None:
            self.record(record)

    def close(self, timeout: float | None = None) -> None:
        """Write what is buffered (at shutdown), within `timeout` seconds (None: no limit)."""
        try:
            self._sink.close(timeout=timeout)
        except Exception as error:
            logger.warning("closing the status store failed: %s: %s", type(error).__name__, error)
