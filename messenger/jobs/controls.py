"""An operator's controls of running consumers: a channel's pause, a running job's cancel.

- **Pause**: the tag `messenger:paused` = `<who>@<UTC time>` on each of the channel's queues
  (`PauseMark`). Consumers read it from their queue once per heartbeat interval (one
  `ListQueueTags`); the tag query behind `messenger top`, the dashboard and the queue alarm
  carries it at no extra request. A Lambda consumer's event source mapping is disabled as well
  (`messenger.operations.pause`).
- **Pause records**: the pause's source of truth, one item per paused queue in the worker
  registry's table (`PauseRecords`: partition key `~paused`, sort key `~pause#<queue name>`,
  who, when and the channel as the operator named it). CloudFormation manages the queue's tags
  and its Lambda event source mappings, so a deploy can undo both (a changed `Tags` property
  rewrites a queue's tags, a replaced mapping is created enabled); it never touches this item.
  A Fargate consumer reads its queue's record (one Query per heartbeat interval; the tag only
  when there is no registry), and the 15-minute queue alarm puts back a tag or re-disables a
  mapping that a deploy undid (`messenger.ops.pauses`).
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
from messenger.errors import ChannelNotFound, InvalidSettings
from messenger.jobs.tables import EXPIRES_AT, ensure_table
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


#: Partition key of the pause records in the worker registry's table, and their sort-key
#: prefix (no channel is named '~paused'; no worker id starts with '~').
PAUSE_PARTITION = "~paused"
PAUSE_PREFIX = "~pause#"


@dataclass(frozen=True)
class PauseRecord:
    """A paused queue: its name, the channel the operator paused, and who and when."""

    queue: str
    channel: str
    mark: PauseMark


class PauseRecords:
    """The namespace's pause records in the worker registry's table (module doc).

    dynamodb: a client of its own (a consumer's has a short read timeout); default the
    factory's."""

    def __init__(self, clients: ClientFactory, settings: Settings,
                 dynamodb: Any | None = None) -> None:
        self.clients = clients
        self.settings = settings
        self.table = workers_table_name(settings.namespace)
        self._dynamodb = dynamodb or clients.client("dynamodb")

    @staticmethod
    def key(queue: str) -> dict[str, Any]:
        return {"channel": {"S": PAUSE_PARTITION}, "worker_id": {"S": PAUSE_PREFIX + queue}}

    def put(self, queue: str, channel: str, mark: PauseMark) -> None:
        """Record `queue` paused. No registry table yet: it is created (provisioning=auto, as
        a consumer's registry would) or ChannelNotFound (verify)."""
        item = {**self.key(queue), "paused_channel": {"S": channel},
                "by": {"S": mark.by[:256]}, "at": {"S": mark.at}}
        try:
            self._dynamodb.put_item(TableName=self.table, Item=item)
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
            ensure_table(self.clients, self.settings, self.table, "worker registry", "channel",
                         "worker_id", dynamodb=self._dynamodb)
            self._dynamodb.put_item(TableName=self.table, Item=item)

    def delete(self, queue: str) -> None:
        """Remove `queue`'s record (none: nothing to do)."""
        try:
            self._dynamodb.delete_item(TableName=self.table, Key=self.key(queue))
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise

    def get(self, queue: str) -> PauseMark | None:
        """`queue`'s pause (None: not paused; ChannelNotFound: no table). One Query: a
        consumer may query the registry (its channel's cancel requests), not get an item."""
        records = self._query({":p": {"S": PAUSE_PARTITION}, ":q": {"S": PAUSE_PREFIX + queue}},
                              "channel = :p AND worker_id = :q")
        if records is None:
            raise ChannelNotFound(f"no worker registry table {self.table}")
        return records[0].mark if records else None

    def all(self) -> list[PauseRecord]:
        """Every paused queue of the namespace (one Query a page; none when no table)."""
        return self._query({":p": {"S": PAUSE_PARTITION}, ":q": {"S": PAUSE_PREFIX}},
                           "channel = :p AND begins_with(worker_id, :q)") or []

    def _query(self, values: dict[str, Any], condition: str) -> list[PauseRecord] | None:
        """The records matching (None: there is no table)."""
        found: list[PauseRecord] = []
        kwargs: dict[str, Any] = {"TableName": self.table, "KeyConditionExpression": condition,
                                  "ExpressionAttributeValues": values}
        while True:
            try:
                page = self._dynamodb.query(**kwargs)
            except ClientError as error:
                if error_code(error) == "ResourceNotFoundException":
                    return None
                raise
            for item in page.get("Items", []):
                found.append(PauseRecord(
                    queue=item["worker_id"]["S"][len(PAUSE_PREFIX):],
                    channel=item.get("paused_channel", {}).get("S", ""),
                    mark=PauseMark(by=item.get("by", {}).get("S", ""),
                                   at=item.get("at", {}).get("S", ""))))
            if "LastEvaluatedKey" not in page:
                return found
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def queue_mappings(awslambda: Any, queue_arn: str) -> list[dict[str, Any]]:
    """The Lambda event source mappings that read a queue (ListEventSourceMappings pages)."""
    pages = awslambda.get_paginator("list_event_source_mappings").paginate(
        EventSourceArn=queue_arn)
    return [m for page in pages for m in page.get("EventSourceMappings", [])]


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
        self.clients = clients
        self.settings = settings
        self.table = workers_table_name(settings.namespace)
        self.channel = channel
        self._dynamodb = dynamodb or clients.client("dynamodb")

    def pause_records(self) -> PauseRecords:
        """The namespace's pause records, read with this client (the same table)."""
        return PauseRecords(self.clients, self.settings, dynamodb=self._dynamodb)

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
