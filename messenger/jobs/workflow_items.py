"""The workflows table's items, as the protocol (`messenger.jobs.workflows`) and its readers
(the HTTP API, the dashboard) see them.

Table `workflows_table_name(ns)`: partition key `id` (S); the sparse global index OPEN_INDEX
('open': `open_shard` (S), `created_at` (N)) holds only items not settled yet. An item:

| attribute | what |
|-----------|------|
| `id` | 'job#<job id>' (a held job) or 'group#<group id>' |
| `job_id`, `channel` | the job it sends and its channel (a group's callback: '<id>.then') |
| `state` | HELD, RELEASING, RELEASED, CANCELLED, EXPIRED (`State`) |
| `policy` | on_dependency_failure: 'cancel' or 'run' (a group: 'run') |
| `deps` | every dependency (a group: its members), in order (L of S) |
| `members` | instead of `deps`, a group whose members are '<id>.0' to '<id>.<N-1>': N |
| `pending` | those not counted yet (SS; absent once empty) |
| `done`, `late` | dependency → `Counted` (M): its outcome as counted, and one that came after |
| `send` | the held message (`HeldSend`), absent for a group without a callback |
| `sent` | a group: False until its producer pushed every member |
| `created_at`, `hold_until`, `retention` | when written; until when it waits (retention) |
| `due_by`, `due_at`, `due_dep` | the last barrier write's token, time, dependency (a group's |
| | mark as sent: token, time): once due, the release's owner |
| `moved_by`, `moved_at`, `reason` | the move out of HELD: its writer's token, when, why |
| `open_shard` | while not settled (the index's partition) |
| `token`, `expires_at` | the writer's token (a retried PutItem finds its own); TTL |
"""

from __future__ import annotations

import enum
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from messenger.jobs.results import FinalOutcome, Outcome
from messenger.jobs.tables import GlobalIndex

#: The sparse index of items not settled yet (the sweeper's), and its shards.
OPEN_INDEX = GlobalIndex("open", "open_shard", "created_at", range_type="N")
OPEN_SHARDS = 4
#: The sweeper leaves items younger than this to whoever is writing them.
SWEEP_GRACE_SECONDS = 600.0
#: What a dependency that failed does to its waiting job.
ON_DEPENDENCY_FAILURE = ("cancel", "run")
#: The most dependencies of one held job, and members of one group (their ids and outcome
#: summaries stay well within a DynamoDB item's 400 KB).
MAX_DEPENDENCIES = 100
MAX_GROUP_MEMBERS = 1_000
#: A held job's encoded message up to this is kept in its item; larger bodies are offloaded.
HELD_INLINE_BYTES = 300_000
JOB, GROUP = "job#", "group#"


class State(str, enum.Enum):  # not StrEnum (3.11): EMR runs Python 3.9 too
    HELD = "HELD"
    RELEASING = "RELEASING"
    RELEASED = "RELEASED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class HeldSend:
    """The send a held job waits to make: `kind` 'sqs' (target: a queue URL) or 'sns' (a topic
    ARN), the encoded body, its message attributes, FIFO group and deduplication ids, and
    whether its producer records status (`tracked`: the release records its QUEUED)."""

    kind: str
    target: str
    body: str
    attributes: Mapping[str, Mapping[str, str]]
    group_id: str | None = None
    dedup_id: str | None = None
    tracked: bool = False

    def item(self) -> dict[str, Any]:
        fields = {"kind": self.kind, "target": self.target, "body": self.body,
                  "attributes": json.dumps(self.attributes, sort_keys=True)}
        if self.tracked:
            fields["tracked"] = "true"
        fields.update({name: value for name, value in (("group_id", self.group_id),
                                                        ("dedup_id", self.dedup_id)) if value})
        return {"M": {name: {"S": value} for name, value in fields.items()}}

    @classmethod
    def of_item(cls, value: Mapping[str, Any]) -> HeldSend:
        fields = {name: entry["S"] for name, entry in value["M"].items()}
        return cls(fields["kind"], fields["target"], fields["body"],
                   json.loads(fields["attributes"]), fields.get("group_id"),
                   fields.get("dedup_id"), fields.get("tracked") == "true")


@dataclass(frozen=True)
class Counted:
    """What the barrier recorded of one dependency: its outcome, when, and why it failed."""

    outcome: str
    at: float
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.COMPLETED.value

    @classmethod
    def of(cls, outcome: FinalOutcome) -> Counted:
        what = f"{outcome.error_type}: {outcome.error}" if outcome.error_type else \
            (outcome.error or outcome.reason)
        return cls(outcome.outcome.value, outcome.at, what[:500])

    def item(self) -> dict[str, Any]:
        # No empty reason: every barrier write bills the whole item (its size, per 1 KB)
        fields = {"outcome": {"S": self.outcome}, "at": {"N": repr(float(self.at))}}
        if self.reason:
            fields["reason"] = {"S": self.reason}
        return {"M": fields}

    @classmethod
    def of_item(cls, value: Mapping[str, Any]) -> Counted:
        fields = value["M"]
        return cls(fields["outcome"]["S"], float(fields["at"]["N"]),
                   fields.get("reason", {}).get("S", ""))


@dataclass(frozen=True)
class Waiting:
    """A held job or a group, as its item says (`dependencies_of`, `group`).

    id: the item id ('job#<id>' or 'group#<id>'). job_id: the job it sends ('' for a group
    without a callback). dependencies: every dependency (a group: its members), in order.
    pending: those not counted yet. done: each counted one's outcome. late: outcomes that came
    after one was counted (a member requeued from its DLQ that completed later)."""

    id: str
    job_id: str
    channel: str
    state: State
    policy: str
    dependencies: tuple[str, ...]
    pending: frozenset[str]
    done: Mapping[str, Counted]
    late: Mapping[str, Counted]
    created_at: float
    hold_until: float
    retention_seconds: int
    send: HeldSend | None = None
    sent: bool = True
    settled: bool = False
    reason: str = ""
    #: The token of the call that moved it out of HELD (see `Workflows._move`), and when.
    moved_by: str = ""
    moved_at: float = 0.0
    #: The token and time of the last barrier write (or a group's mark as sent): once the
    #: release is due, its owner's (see `Workflows._act`).
    due_by: str = ""
    due_at: float = 0.0
    #: The dependency that write counted ('' for a group's mark as sent).
    due_dep: str = ""

    @property
    def due(self) -> bool:
        """Nothing pending and, a group, every member pushed: a release or a cancel is due."""
        return not self.pending and self.sent

    @property
    def is_group(self) -> bool:
        return self.id.startswith(GROUP)

    @classmethod
    def of_item(cls, item: Mapping[str, Any]) -> Waiting:
        def text(name: str) -> str:
            return str(item.get(name, {}).get("S", ""))

        def counted(name: str) -> dict[str, Counted]:
            return {dep: Counted.of_item(value)
                    for dep, value in item.get(name, {}).get("M", {}).items()}

        item_id = text("id")
        if "members" in item:  # a group's members by their derived ids
            dependencies = tuple(group_member_id(item_id[len(GROUP):], n)
                                 for n in range(int(item["members"]["N"])))
        else:
            dependencies = tuple(entry["S"] for entry in item.get("deps", {}).get("L", []))
        return cls(
            id=item_id, job_id=text("job_id"), channel=text("channel"),
            state=State(text("state")), policy=text("policy"),
            dependencies=dependencies,
            pending=frozenset(item.get("pending", {}).get("SS", [])),
            done=counted("done"), late=counted("late"),
            created_at=float(item["created_at"]["N"]), hold_until=float(item["hold_until"]["N"]),
            retention_seconds=int(item["retention"]["N"]),
            send=HeldSend.of_item(item["send"]) if "send" in item else None,
            sent=bool(item.get("sent", {}).get("BOOL", True)),
            settled="open_shard" not in item, reason=text("reason"),
            moved_by=text("moved_by"), moved_at=float(item.get("moved_at", {}).get("N", 0)),
            due_by=text("due_by"), due_at=float(item.get("due_at", {}).get("N", 0)),
            due_dep=text("due_dep"))


@dataclass(frozen=True)
class GroupProgress:
    """A group's progress: its members, how many reached a final outcome (`finished`) and how
    many of those failed, its state (HELD until the callback is released), the callback's job
    id ('' without one) and the members recorded late."""

    group_id: str
    members: tuple[str, ...]
    finished: int
    failed: int
    state: State
    then_job: str
    sent: bool
    late: tuple[str, ...] = ()
    outcomes: Mapping[str, Counted] = field(default_factory=dict)


@dataclass(frozen=True)
class Dependent:
    """What waits on a job: a held job (`job_id`), or a group (`group_id`, its callback's
    `job_id`)."""

    job_id: str
    group_id: str = ""


@dataclass
class SweepReport:
    """What one sweep did: items looked at, dependencies applied, releases, cancels, expiries,
    members failed as never sent."""

    looked: int = 0
    applied: int = 0
    released: int = 0
    cancelled: int = 0
    expired: int = 0
    never_sent: int = 0


def group_member_id(group_id: str, index: int) -> str:
    return f"{group_id}.{index}"


def group_then_id(group_id: str) -> str:
    return f"{group_id}.then"


def dependencies_text(entries: list[tuple[str, FinalOutcome | None, Counted | None]],
                       budget: int) -> str:
    """DEPENDENCIES_HEADER's JSON (decoded by `messenger.message.decode_dependencies`): each
    dependency's {"result": value}, or {"outcome", "error_type", "error", "reason"} of a
    failure, the outcome counted by the barrier. Results that do not fit within `budget`
    bytes are left out, the largest first ({"omitted": true}: read them with
    `Producer.result`)."""
    values: dict[str, dict[str, Any]] = {}
    for dep, outcome, counted in entries:
        if outcome is not None and counted is not None and \
                outcome.outcome.value != counted.outcome:
            outcome = None  # finished again since it was counted: the counted outcome stands
        if outcome is not None and outcome.ok:
            values[dep] = {"result": outcome.result}
        elif outcome is not None:
            values[dep] = {"outcome": outcome.outcome.value, **{
                name: getattr(outcome, name) for name in ("error_type", "error", "reason")
                if getattr(outcome, name)}}
        elif counted is not None and counted.ok:
            values[dep] = {"omitted": True}
        else:
            values[dep] = {"outcome": counted.outcome if counted else Outcome.EXPIRED.value,
                           "reason": counted.reason if counted else "no outcome recorded"}
    sizes = sorted(((len(json.dumps(value)), dep) for dep, value in values.items()
                    if "result" in value), reverse=True)
    text = json.dumps(values, separators=(",", ":"))
    for _, dep in sizes:
        if len(text.encode()) <= budget:
            return text
        values[dep] = {"omitted": True}
        text = json.dumps(values, separators=(",", ":"))
    # Still too large (many failures, a body near the limit): shorter texts, then outcomes only.
    for keep in (200, 0):
        if len(text.encode()) <= budget:
            break
        for value in values.values():
            for name in ("error_type", "error", "reason"):
                if name in value:
                    value[name] = value[name][:keep]
                    if not keep:
                        del value[name]
        text = json.dumps(values, separators=(",", ":"))
    return text


def open_shard(item_id: str) -> str:
    return str(zlib.crc32(item_id.encode()) % OPEN_SHARDS)


__all__ = ["GROUP", "HELD_INLINE_BYTES", "JOB", "MAX_DEPENDENCIES", "MAX_GROUP_MEMBERS",
           "ON_DEPENDENCY_FAILURE", "OPEN_INDEX", "OPEN_SHARDS", "SWEEP_GRACE_SECONDS",
           "Counted", "Dependent", "GroupProgress", "HeldSend", "State", "SweepReport",
           "Waiting", "dependencies_text", "group_member_id", "group_then_id", "open_shard"]
