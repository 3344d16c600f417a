"""The audit trail: one record per operator action taken from the dashboard (requeue, delete,
requeue-all, pause, resume, cancel a running job, cancel scheduled jobs) and per refused
attempt (a viewer's 403, a cross-site or wrong-token 403), with who (the provider's `sub` and
e-mail, marked when the provider says it is not verified), when, on what, and the result.

    trail = AuditTrail(clients, settings)
    trail.record(AuditEntry.now("pause", "orders", actor=..., result="done", detail="..."))
    trail.recent(limit=50)            # newest first (`messenger audit`, the dashboard's /audit)

The store is the table `<namespace->messenger-audit` (`messenger.channel.audit_table_name`),
which the CDK app creates with the dashboard (`stacks.dashboard_service`), so it exists wherever
the dashboard does, with or without a status table; `messenger dashboard` creates it on first
use (provisioning=auto). Keys: `day` (the UTC date, partition) and `entry` (UTC time to the
microsecond + a random suffix, sort key), so the newest entries are one Query per day.

Append-only: an entry is written with PutItem under `attribute_not_exists(entry)` (an entry is
never overwritten), nothing here updates or deletes one, and the dashboard's role may only
DescribeTable, PutItem and Query it. Entries expire after RETENTION_DAYS (DynamoDB TTL).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, error_code
from messenger.channel import audit_table_name
from messenger.jobs.tables import EXPIRES_AT, ensure_table
from messenger.settings import Settings

#: Days an entry is kept (DynamoDB TTL on `expires_at`).
RETENTION_DAYS = 400
#: At most this many targets (ids) are kept per entry, each at most MAX_TARGET_LENGTH chars
#: (a refused attempt's form is the requester's, not validated).
MAX_TARGETS = 100
MAX_TARGET_LENGTH = 200
#: Longest text kept in a free field (detail, actor, action).
MAX_TEXT = 1000
#: Results an entry can have.
RESULTS = ("done", "partial", "failed", "refused")
#: Days `recent` looks back by default.
DEFAULT_DAYS = 30


def _text(value: str, limit: int = MAX_TEXT) -> str:
    value = "".join(c if c.isprintable() else "?" for c in str(value))
    return value if len(value) <= limit else value[: limit - 1] + "…"


@dataclass(frozen=True)
class AuditEntry:
    """One operator action or refused attempt.

    actor: who, as shown (an unverified e-mail carries " (unverified)"); sub / email /
    email_verified: the identity's claims as signed (email_verified None: not said); role:
    viewer or operator. action: requeue, delete, requeue-all, pause, resume, cancel-job,
    cancel-scheduled. channel and targets: what it named (ids). result: done, partial (some
    targets failed), failed (an error stopped it) or refused (403). detail: one line saying
    what happened or why it was refused. source: where it came from (dashboard)."""

    at: float
    action: str
    channel: str
    actor: str
    result: str
    detail: str = ""
    targets: tuple[str, ...] = ()
    sub: str = ""
    email: str = ""
    email_verified: bool | None = None
    role: str = ""
    source: str = "dashboard"
    entry: str = field(default="")

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise ValueError(f"result must be one of {', '.join(RESULTS)}, got {self.result!r}")
        if not self.entry:
            moment = datetime.fromtimestamp(self.at, timezone.utc)
            object.__setattr__(self, "entry", f"{moment.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}#"
                                              f"{secrets.token_hex(4)}")

    @property
    def day(self) -> str:
        return self.entry[:10]

    @property
    def who(self) -> str:
        """actor, with the sub when it says more (`ada@example.com [sub u-1]`)."""
        return f"{self.actor} [sub {self.sub}]" if self.sub and self.sub != self.actor \
            else self.actor

    def item(self) -> dict[str, Any]:
        item: dict[str, Any] = {
            "day": {"S": self.day}, "entry": {"S": self.entry}, "at": {"N": repr(self.at)},
            "action": {"S": _text(self.action, 64)}, "channel": {"S": _text(self.channel, 256)},
            "actor": {"S": _text(self.actor) or "unknown"}, "result": {"S": self.result},
            "source": {"S": self.source},
            EXPIRES_AT: {"N": str(int(self.at + RETENTION_DAYS * 86_400))},
        }
        for name in ("detail", "sub", "email", "role"):
            value = getattr(self, name)
            if value:
                item[name] = {"S": _text(value)}
        if self.email_verified is not None:
            item["email_verified"] = {"BOOL": self.email_verified}
        if self.targets:
            item["targets"] = {"L": [{"S": _text(t, MAX_TARGET_LENGTH)}
                                     for t in self.targets[:MAX_TARGETS]]}
            if len(self.targets) > MAX_TARGETS:
                item["targets_total"] = {"N": str(len(self.targets))}
        return item

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> AuditEntry:
        def text(name: str) -> str:
            return str(item.get(name, {}).get("S", ""))

        verified = item.get("email_verified", {}).get("BOOL")
        return cls(
            at=float(item["at"]["N"]), action=text("action"), channel=text("channel"),
            actor=text("actor"), result=text("result"), detail=text("detail"),
            targets=tuple(str(t.get("S", "")) for t in item.get("targets", {}).get("L", [])),
            sub=text("sub"), email=text("email"),
            email_verified=None if verified is None else bool(verified), role=text("role"),
            source=text("source") or "dashboard", entry=text("entry"))

    def line(self) -> str:
        """One line for the terminal: time, who, action, channel, result, detail."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.at))
        targets = f" [{', '.join(self.targets[:5])}{', ...' if len(self.targets) > 5 else ''}]" \
            if self.targets else ""
        role = f" ({self.role})" if self.role else ""
        return (f"{when}Z  {self.who}{role}  {self.action} {self.channel}{targets}  "
                f"{self.result}" + (f": {self.detail}" if self.detail else ""))


class AuditTrail:
    """The namespace's audit trail table (module doc)."""

    def __init__(self, clients: ClientFactory, settings: Settings,
                 dynamodb: Any | None = None) -> None:
        self.clients = clients
        self.settings = settings
        self.table = audit_table_name(settings.namespace)
        self._dynamodb = dynamodb or clients.client("dynamodb")

    def ensure(self) -> None:
        """Create the table (provisioning=auto) or check it exists (verify: ChannelNotFound)."""
        ensure_table(self.clients, self.settings, self.table, "audit trail", "day", "entry",
                     dynamodb=self._dynamodb)

    def record(self, entry: AuditEntry) -> AuditEntry:
        """Append `entry` (never overwriting one: attribute_not_exists). No table yet: it is
        created (auto) or ChannelNotFound (verify)."""
        kwargs = {"TableName": self.table, "Item": entry.item(),
                  "ConditionExpression": "attribute_not_exists(#e)",
                  "ExpressionAttributeNames": {"#e": "entry"}}
        try:
            self._dynamodb.put_item(**kwargs)
        except ClientError as error:
            if error_code(error) != "ResourceNotFoundException":
                raise
            self.ensure()
            self._dynamodb.put_item(**kwargs)
        return entry

    def recent(self, limit: int = 100, days: int = DEFAULT_DAYS, channel: str | None = None,
               actor: str | None = None, now: float | None = None) -> list[AuditEntry]:
        """The newest `limit` entries of the last `days` days, newest first; channel / actor
        (an exact actor, e-mail or sub) narrow them. No table: none."""
        found: list[AuditEntry] = []
        for entry in self._entries(days, now):
            if channel is not None and entry.channel != channel:
                continue
            if actor is not None and actor not in (entry.actor, entry.email, entry.sub):
                continue
            found.append(entry)
            if len(found) >= limit:
                break
        return found

    def _entries(self, days: int, now: float | None) -> Iterator[AuditEntry]:
        today = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc)
        for back in range(days):
            day = (today - timedelta(days=back)).strftime("%Y-%m-%d")
            kwargs: dict[str, Any] = {
                "TableName": self.table, "KeyConditionExpression": "#d = :d",
                "ExpressionAttributeNames": {"#d": "day"},
                "ExpressionAttributeValues": {":d": {"S": day}}, "ScanIndexForward": False}
            while True:
                try:
                    page = self._dynamodb.query(**kwargs)
                except ClientError as error:
                    if error_code(error) == "ResourceNotFoundException":
                        return
                    raise
                for item in page.get("Items", []):
                    yield AuditEntry.from_item(item)
                if not page.get("LastEvaluatedKey"):
                    break
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def targets_of(values: Sequence[str]) -> tuple[str, ...]:
    """The ids to record (at most MAX_TARGETS kept by `AuditEntry.item`)."""
    return tuple(str(v) for v in values)
