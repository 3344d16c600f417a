"""Who is working: a registry of consumer processes in a DynamoDB table.

Each consumer process writes one entry (`WorkerEntry`: worker id, host, ECS task ARN when on ECS,
channel, state, started, last seen, messages in flight, processed and failed counts) when it
starts, refreshes it every `Settings.worker_interval` seconds (default 30) from its watchdog
thread, and sooner when its state or counts changed, at most once per `CHANGE_WRITE_SECONDS`
(2 s: a busy worker's entry is never more than a few seconds stale, and a worker switching
between LISTENING and PROCESSING twice per poll writes at most every 2 s), and deletes it at
a clean exit. An entry not refreshed for `LOST_AFTER_INTERVALS`
intervals is shown as lost (a killed process, a frozen host); entries expire by TTL
(`EXPIRY_SECONDS` after their last refresh). A registry failure is logged, never fatal: the
registry observes, it does not gate message processing.

Table `<namespace->messenger-workers`: partition key `channel`, sort key `worker_id`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import workers_table_name
from messenger.errors import ChannelNotFound, MessengerError
from messenger.jobs.tables import EXPIRES_AT, ensure_table
from messenger.settings import Settings

logger = logging.getLogger("messenger.workers")

#: A worker silent this many intervals is shown as lost.
LOST_AFTER_INTERVALS = 3
#: An entry expires (DynamoDB TTL) this long after its last refresh: a lost worker stays
#: visible for a day, then disappears.
EXPIRY_SECONDS = 86_400
#: ECS task metadata endpoint (v4), set by the ECS agent in every container.
METADATA_VARIABLE = "ECS_CONTAINER_METADATA_URI_V4"
#: Seconds a registry write may take; it runs on the consumer's watchdog thread.
WRITE_TIMEOUT = 2.0
#: A changed entry (state, in flight, counts) is written at most this often.
CHANGE_WRITE_SECONDS = 2.0


@dataclass(frozen=True)
class WorkerEntry:
    """One consumer process as the registry holds it."""

    channel: str
    worker_id: str
    host: str
    task_arn: str
    consumer: str
    state: str
    started_at: float
    last_seen: float
    interval: float
    in_flight: int = 0
    processed: int = 0
    failed: int = 0

    def lost(self, now: float | None = None) -> bool:
        """Silent for LOST_AFTER_INTERVALS intervals (killed, frozen or cut off)."""
        return (now or time.time()) - self.last_seen > LOST_AFTER_INTERVALS * self.interval

    def item(self) -> dict[str, Any]:
        return {
            "channel": {"S": self.channel}, "worker_id": {"S": self.worker_id},
            "host": {"S": self.host}, "task_arn": {"S": self.task_arn},
            "consumer": {"S": self.consumer}, "state": {"S": self.state},
            "started_at": {"N": repr(self.started_at)}, "last_seen": {"N": repr(self.last_seen)},
            "interval": {"N": repr(float(self.interval))},
            "in_flight": {"N": str(self.in_flight)}, "processed": {"N": str(self.processed)},
            "failed": {"N": str(self.failed)},
            EXPIRES_AT: {"N": str(int(self.last_seen + EXPIRY_SECONDS))},
        }

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> WorkerEntry:
        def text(name: str) -> str:
            return str(item.get(name, {}).get("S", ""))

        def number(name: str) -> float:
            return float(item.get(name, {}).get("N", 0))

        return cls(
            channel=text("channel"), worker_id=text("worker_id"), host=text("host"),
            task_arn=text("task_arn"), consumer=text("consumer"), state=text("state"),
            started_at=number("started_at"), last_seen=number("last_seen"),
            interval=number("interval") or 30.0, in_flight=int(number("in_flight")),
            processed=int(number("processed")), failed=int(number("failed")),
        )


def ecs_task_arn(environ: Mapping[str, str], timeout: float = 1.0) -> str:
    """The ECS task's ARN from the task metadata endpoint ('' outside ECS or when it fails)."""
    base = environ.get(METADATA_VARIABLE)
    if not base:
        return ""
    try:
        with urllib.request.urlopen(f"{base.rstrip('/')}/task", timeout=timeout) as response:
            return str(json.load(response).get("TaskARN", ""))
    except (OSError, ValueError) as error:
        logger.warning("reading the ECS task metadata failed: %s", error)
        return ""


class WorkerRegistry:
    """One consumer process's entry: `start`, `beat` (every watchdog tick; writes when due),
    `count` (per lifecycle event), `stop`. Never raises: failures are logged and counted."""

    def __init__(
        self, clients: ClientFactory, settings: Settings, channel: str, consumer: str,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.environ = os.environ if environ is None else environ
        self.clients = clients
        self.settings = settings
        self.table = workers_table_name(settings.namespace)
        self.entry = WorkerEntry(
            channel=channel, worker_id=f"{socket.gethostname()}:{os.getpid()}:"
            f"{uuid.uuid4().hex[:6]}", host=socket.gethostname(), task_arn="",
            consumer=consumer, state="INITIALIZING", started_at=time.time(),
            last_seen=time.time(), interval=settings.worker_interval,
        )
        self.processed = 0
        self.failed = 0
        self.write_failures = 0
        #: False until `start`, and when the table is not deployed (verify mode): no writes.
        self.enabled = False
        self._next = 0.0
        #: When the last write went out (monotonic): a change waits CHANGE_WRITE_SECONDS.
        self._written_at = 0.0
        self._dynamodb: Any = None

    def _client(self) -> Any:
        if self._dynamodb is None:
            # Its own client with a short read timeout; calls run within a WRITE_TIMEOUT budget
            # (botocore stops retrying past it; the next beat is the retry), so an unreachable
            # DynamoDB holds the watchdog up at most once per interval, for a few seconds.
            self._dynamodb = self.clients.client("dynamodb", read_timeout=WRITE_TIMEOUT)
        return self._dynamodb

    def _call(self, what: str, **request: Any) -> None:
        try:
            call_with_budget(lambda: getattr(self._client(), what)(**request), WRITE_TIMEOUT,
                             f"worker registry {what}")
        except (ClientError, BotoCoreError, MessengerError) as error:
            self.write_failures += 1
            logger.warning("worker registry: %s of %s failed: %s", what, self.entry.worker_id,
                           error)

    def due(self, state: str | None = None, in_flight: int | None = None) -> bool:
        """An interval has passed since the last write; or, given the current state and
        messages in flight, they or the counts changed and CHANGE_WRITE_SECONDS have passed."""
        if not self.enabled:
            return False
        now = time.monotonic()
        if now >= self._next:
            return True
        if state is None or now - self._written_at < CHANGE_WRITE_SECONDS:
            return False
        entry = self.entry
        return (state != entry.state or in_flight != entry.in_flight
                or self.processed != entry.processed or self.failed != entry.failed)

    def start(self, state: str) -> None:
        """Make sure the table exists (auto) and write the first entry (with the ECS task's ARN
        when on ECS)."""
        self.entry = replace(self.entry, task_arn=ecs_task_arn(self.environ))
        self.enabled = True
        try:
            ensure_table(self.clients, self.settings, self.table, "worker registry", "channel",
                         "worker_id", dynamodb=self._client())
        except ChannelNotFound as error:  # verify mode, not deployed: do without, say so once
            logger.warning("worker registry off: %s", error)
            self.enabled = False
            return
        except (ClientError, BotoCoreError) as error:  # the beats try again
            logger.warning("worker registry %s unavailable: %s", self.table, error)
        self.beat(state, 0, force=True)

    def count(self, event: str) -> None:
        """Count a lifecycle event: 'completed' is processed, 'failed' (the handler raised) and
        'timed_out' failed (cheap: no I/O; the next beat writes the counts)."""
        if event == "completed":
            self.processed += 1
        elif event in ("failed", "timed_out"):
            self.failed += 1

    def beat(self, state: str, in_flight: int, force: bool = False) -> None:
        """Refresh the entry when an interval has passed since the last write (or `force`)."""
        if not self.enabled or (not force and not self.due(state, in_flight)):
            return
        self._written_at = time.monotonic()
        self._next = self._written_at + self.entry.interval
        self.entry = replace(self.entry, state=state, last_seen=time.time(), in_flight=in_flight,
                             processed=self.processed, failed=self.failed)
        self._call("put_item", TableName=self.table, Item=self.entry.item())

    def stop(self) -> None:
        """Remove the entry (a clean exit)."""
        if not self.enabled:
            return
        self._call("delete_item", TableName=self.table, Key={
            "channel": {"S": self.entry.channel}, "worker_id": {"S": self.entry.worker_id}})

def list_workers(
    clients: ClientFactory, settings: Settings, channel: str | None = None
) -> list[WorkerEntry]:
    """The registered workers (of one channel, or all), by channel then start time; an empty
    list when no consumer has registered yet (no table)."""
    dynamodb = clients.client("dynamodb")
    table = workers_table_name(settings.namespace)
    if channel is None:
        pages = dynamodb.get_paginator("scan").paginate(TableName=table)
    else:
        pages = dynamodb.get_paginator("query").paginate(
            TableName=table, KeyConditionExpression="channel = :c",
            ExpressionAttributeValues={":c": {"S": channel}})
    try:
        # (Cancel requests share the table: `messenger.jobs.controls`.)
        entries = [WorkerEntry.from_item(item) for page in pages for item in page.get("Items", [])
                   if not item.get("worker_id", {}).get("S", "").startswith("~")]
    except ClientError as error:
        if error_code(error) == "ResourceNotFoundException":
            return []
        raise
    return sorted(entries, key=lambda e: (e.channel, e.started_at))
