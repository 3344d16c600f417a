"""An operator's controls of running consumers: a channel's pause, a running job's cancel.

- **Pause**: the tag `messenger:paused` = `<who>@<UTC time>` on each of the channel's queues
  (`PauseMark`). Consumers read it from their queue once per heartbeat interval (one
  `ListQueueTags`); the tag query behind `messenger top`, the dashboard and the queue alarm
  carries it at no extra request. A Lambda consumer's event source mapping is disabled as well
  (`messenger.operations.pause`).
- **Cancel**: a request item in the worker registry's table (`CancelRequest`: partition key the
  channel, sort key `~cancel#<message id>`, who and when, expiring after `CANCEL_EXPIRY_SECONDS`).
  A consumer holding running messages reads its channel's requests once per heartbeat interval
  (one `Query`), stops a requested job as a processing timeout would (dead-lettered with the
  reason `cancelled by <who>`) and deletes the request. `messenger.jobs.workers.list_workers`
  skips these items.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, error_code
from messenger.channel import workers_table_name
from messenger.errors import InvalidSettings
from messenger.jobs.tables import EXPIRES_AT
from messenger.settings import Settings

#: The queue tag that pauses a channel's consumers: "<who>@<UTC time, ISO 8601>".
TAG_PAUSED = "messenger:paused"
#: Sort-key prefix of a cancel request in the worker registry's table (no worker id starts
#: with '~': they start with a host name).
CANCEL_PREFIX = "~cancel#"
#: A cancel request no consumer acted on (the job was not running) expires after an hour.
CANCEL_EXPIRY_SECONDS = 3600
#: SQS tag values hold at most 256 characters.
MAX_TAG_VALUE = 256


def utc_text(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PauseMark:
    """Who paused a channel, and when (the `TAG_PAUSED` tag's value)."""

    by: str
    at: str

    @classmethod
    def now(cls, actor: str) -> PauseMark:
        return cls(by=actor or "unknown", at=utc_text(time.time()))

    @classmethod
    def parse(cls, value: str | None) -> PauseMark | None:
        """The mark a tag value holds (None: no value, not paused). The actor may contain '@'
        (an e-mail address): the time follows the last one."""
        if not value:
            return None
        by, sep, at = value.rpartition("@")
        return cls(by=by, at=at) if sep else cls(by=value, at="")

    def tag_value(self) -> str:
        suffix = f"@{self.at}"
        return self.by[: MAX_TAG_VALUE - len(suffix)] + suffix

    def __str__(self) -> str:
        return f"paused by {self.by}" + (f" at {self.at}" if self.at else "")


def read_pause(sqs: Any, queue_url: str) -> PauseMark | None:
    """The pause mark on a queue (one ListQueueTags; None: not paused)."""
    tags = sqs.list_queue_tags(QueueUrl=queue_url).get("Tags") or {}
    return PauseMark.parse(tags.get(TAG_PAUSED))


@dataclass(frozen=True)
class CancelRequest:
    """An operator's request to stop a running job (by its message id)."""

    channel: str
    message_id: str
    by: str
    at: float

    def key(self) -> dict[str, Any]:
        return {"channel": {"S": self.channel},
                "worker_id": {"S": CANCEL_PREFIX + self.message_id}}

    def item(self) -> dict[str, Any]:
        return {**self.key(), "by": {"S": self.by[:256]}, "at": {"N": repr(self.at)},
                EXPIRES_AT: {"N": str(int(self.at + CANCEL_EXPIRY_SECONDS))}}

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> CancelRequest:
        return cls(channel=item["channel"]["S"],
                   message_id=item["worker_id"]["S"][len(CANCEL_PREFIX):],
                   by=item.get("by", {}).get("S", ""), at=float(item.get("at", {}).get("N", 0)))


def is_control_item(worker_id: str) -> bool:
    """A worker-registry item that is a control (a cancel request), not a worker."""
    return worker_id.startswith("~")


class CancelRequests:
    """A channel's cancel requests in the worker registry's table."""

    def __init__(self, clients: ClientFactory, settings: Settings, channel: str,
                 dynamodb: Any | None = None) -> None:
        self.table = workers_table_name(settings.namespace)
        self.channel = channel
        self._dynamodb = dynamodb or clients.client("dynamodb")

    def request(self, message_id: str, actor: str) -> CancelRequest:
        """Ask the consumer running `message_id` to stop it (at its next heartbeat)."""
        made = CancelRequest(self.channel, message_id, actor or "unknown", time.time())
        try:
            self._dynamodb.put_item(TableName=self.table, Item=made.item())
        except ClientError as error:
            if error_code(error) == "ResourceNotFoundException":
                raise InvalidSettings(
                    f"no worker registry table {self.table}: no consumer of this namespace has "
                    f"registered, so none runs {message_id!r}") from None
            raise
        return made

    def pending(self) -> dict[str, CancelRequest]:
        """The channel's requests by message id (one Query; none when there is no table)."""
        try:
            answer = self._dynamodb.query(
                TableName=self.table,
                KeyConditionExpression="channel = :c AND begins_with(worker_id, :p)",
                ExpressionAttributeValues={":c": {"S": self.channel},
                                           ":p": {"S": CANCEL_PREFIX}})
        except ClientError as error:
            if error_code(error) == "ResourceNotFoundException":
                return {}
            raise
        now = time.time()
        found = [CancelRequest.from_item(i) for i in answer.get("Items", [])
                 if float(i.get(EXPIRES_AT, {}).get("N", now + 1)) > now]
        return {r.message_id: r for r in found}

    def done(self, request: CancelRequest) -> None:
        """Remove a request acted on (a requeued copy of the job is not cancelled again)."""
        self._dynamodb.delete_item(TableName=self.table, Key=request.key())
