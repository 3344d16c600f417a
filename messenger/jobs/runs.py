"""The ledger of a publishing run: which partitions of a run key finished, with their counts.

A Spark `publish(..., run_key=K)` derives each row's job id from K and the row's key columns and
pushes it with dedup on enqueue (`messenger.jobs.dedup`), so a re-run of K sends only the rows
its earlier attempts did not. This ledger saves the re-run the claim per row of a partition that
already finished: each partition that published all its rows (none failed) records itself, and
an attempt that finds its partition recorded skips every row of it (one GetItem per partition).

Items live in the dedup table (`DedupTable`), under keys no producer claim can have (a channel
name holds no '@'), and expire with the run's window, as the rows' claims do:

- `run@<run key>`: channel, partitions, created_at, attempts and the last attempt's counts;
- `run@<run key>#<index>`: a finished partition's counts (published, skipped, duplicates) and
  the fingerprint of its rows (count and an order-free sum of their job ids' hashes): a re-run
  whose partition holds other rows (a changed input under the same run key) fails loudly
  instead of skipping rows never sent.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from messenger.aws import ClientFactory, call_with_budget
from messenger.errors import InvalidSettings
from messenger.jobs.dedup import DedupTable, check_window
from messenger.jobs.tables import EXPIRES_AT, put_unless_held
from messenger.settings import Settings

#: Key prefix of the run ledger's items in the dedup table (no channel name holds an '@').
RUN_LEDGER_PREFIX = "run@"
#: A run key: 1 to 80 letters, digits, '.', '_', '=' or '-', starting with a letter or digit
#: (80 leaves room in a 128-character job id for ':' and the key columns' digest).
RUN_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,79}$")
#: Default days a run's rows (and this ledger) count as sent: a re-run within it sends nothing
#: twice. 1 to 14 days (SQS's longest retention: a later re-run finds no message of the first).
DEFAULT_RUN_WINDOW_SECONDS = 7 * 86_400
#: Counts a partition (and an attempt) records.
COUNTS = ("published", "skipped", "duplicates", "failed")
#: BatchGetItem's limit of keys per request.
MAX_BATCH_GET = 100
_FINGERPRINT_MOD = 2**64


def check_run_key(run_key: Any) -> str:
    if not isinstance(run_key, str) or not RUN_KEY.match(run_key):
        raise InvalidSettings(
            f"run_key must be 1 to 80 letters, digits, '.', '_', '=' or '-' (starting with a "
            f"letter or digit), got {run_key!r}"
        )
    return run_key


def job_id(run_key: str, key: str) -> str:
    """The job id of a row of run `run_key` whose key columns encode to `key` (JSON text):
    '<run key>:<32 hex of sha256(run key, key)>'; the same row of the same run, the same id."""
    digest = hashlib.sha256(f"{run_key}\0{key}".encode()).hexdigest()[:32]
    return f"{run_key}:{digest}"


@dataclass
class Fingerprint:
    """The rows of a partition, order-free: their count and the sum of their job ids' hashes."""

    rows: int = 0
    total: int = 0

    def add(self, identifier: str) -> None:
        self.rows += 1
        head = hashlib.blake2b(identifier.encode(), digest_size=8).digest()
        self.total = (self.total + int.from_bytes(head, "big")) % _FINGERPRINT_MOD

    def text(self) -> str:
        return f"{self.rows}:{self.total:016x}"


@dataclass(frozen=True)
class PartitionRecord:
    """A finished partition: its counts and fingerprint, when it finished (epoch seconds)."""

    index: int
    fingerprint: str
    counts: Mapping[str, int] = field(default_factory=dict)
    finished_at: float = 0.0

    @property
    def rows(self) -> int:
        return int(self.fingerprint.split(":", 1)[0] or 0)


@dataclass(frozen=True)
class RunSummary:
    """What `messenger emr run` shows: the run's partitions finished, and the rows published
    and skipped by the attempts that finished them (skipped: already sent by an earlier one)."""

    run_key: str
    channel: str
    partitions: int
    finished: int
    attempts: int
    counts: Mapping[str, int]
    created_at: float
    last_attempt: Mapping[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {"run_key": self.run_key, "channel": self.channel, "partitions": self.partitions,
                "finished_partitions": self.finished, "attempts": self.attempts,
                **self.counts, "created_at": self.created_at,
                "last_attempt": dict(self.last_attempt)}


class RunLedger:
    """One run key's ledger (see the module doc). The driver calls `start` and `attempt_done`;
    each partition `finished` when it starts and `finish` when all its rows were published.

    window_seconds: how long the run's items live (1 s to 14 days), as the rows' claims."""

    def __init__(self, clients: ClientFactory, settings: Settings, run_key: str,
                 channel: str = "", partitions: int = 0,
                 window_seconds: int = DEFAULT_RUN_WINDOW_SECONDS) -> None:
        self.clients = clients
        self.settings = settings
        self.run_key = check_run_key(run_key)
        self.channel = channel
        self.partitions = partitions
        self.window = check_window(window_seconds, "run_window")
        self._table = DedupTable(clients, settings)

    @property
    def key(self) -> str:
        return f"{RUN_LEDGER_PREFIX}{self.run_key}"

    def partition_key(self, index: int) -> str:
        return f"{self.key}#{index}"

    def _call(self, what: str, method: str, **request: Any) -> Any:
        self._table.ensure()
        dynamodb = self.clients.client("dynamodb")
        call = functools.partial(getattr(dynamodb, method), TableName=self._table.name, **request)
        return call_with_budget(call, self.settings.retry_budget_seconds, what)

    def start(self) -> None:
        """On the driver, before any task: record the run (channel, partitions) or check that
        an earlier attempt of it published to the same channel in as many partitions (a row's
        partition depends on their number); InvalidSettings naming the difference."""
        now = time.time()
        item = {"dedup_key": {"S": self.key}, "channel": {"S": self.channel},
                "partitions": {"N": str(self.partitions)}, "created_at": {"N": repr(now)},
                "attempts": {"N": "0"}, EXPIRES_AT: {"N": str(int(now) + self.window)}}
        self._table.ensure()
        old = put_unless_held(self.clients.client("dynamodb"), {
            "TableName": self._table.name, "Item": item,
            "ConditionExpression": "attribute_not_exists(dedup_key) OR expires_at <= :now",
            "ExpressionAttributeValues": {":now": {"N": repr(now)}},
        }, self.settings.retry_budget_seconds, f"recording run {self.run_key!r}")
        if old is None:
            return
        channel = old.get("channel", {}).get("S", "")
        partitions = int(old.get("partitions", {}).get("N", 0))
        if (channel, partitions) != (self.channel, self.partitions):
            raise InvalidSettings(
                f"run_key {self.run_key!r} was published to channel {channel!r} in "
                f"{partitions} partitions; re-run it with the same channel and partitions, or "
                f"use a new run_key"
            )

    def attempt_done(self, counts: Mapping[str, int]) -> None:
        """On the driver, after an attempt that ran to its end: count it, keep its counts."""
        values = {f":{name}": {"N": str(int(counts.get(name, 0)))} for name in COUNTS}
        self._call(
            f"recording an attempt of run {self.run_key!r}", "update_item",
            Key={"dedup_key": {"S": self.key}},
            UpdateExpression="ADD attempts :one SET " + ", ".join(
                f"last_{name} = :{name}" for name in COUNTS),
            ExpressionAttributeValues={":one": {"N": "1"}, **values},
        )

    def finished(self, index: int) -> PartitionRecord | None:
        """The record of partition `index` if an attempt finished it (one consistent read)."""
        item = self._call(f"reading run {self.run_key!r} partition {index}", "get_item",
                          Key={"dedup_key": {"S": self.partition_key(index)}},
                          ConsistentRead=True).get("Item")
        return None if item is None else _record(item)

    def finish(self, index: int, fingerprint: Fingerprint, counts: Mapping[str, int]) -> None:
        """Record partition `index` as finished: every row published (or already sent)."""
        now = time.time()
        item = {"dedup_key": {"S": self.partition_key(index)}, "run_key": {"S": self.run_key},
                "partition": {"N": str(index)}, "fingerprint": {"S": fingerprint.text()},
                "finished_at": {"N": repr(now)}, EXPIRES_AT: {"N": str(int(now) + self.window)},
                **{name: {"N": str(int(counts.get(name, 0)))} for name in COUNTS}}
        self._call(f"recording run {self.run_key!r} partition {index}", "put_item", Item=item)

    def summary(self) -> RunSummary | None:
        """The run's summary (None: no such run, or its window is over)."""
        run = self._call(f"reading run {self.run_key!r}", "get_item",
                         Key={"dedup_key": {"S": self.key}}, ConsistentRead=True).get("Item")
        if run is None or float(run.get(EXPIRES_AT, {}).get("N", 0)) <= time.time():
            return None
        partitions = int(run["partitions"]["N"])
        records = self._records(partitions)
        counts = {name: sum(int(r.counts.get(name, 0)) for r in records) for name in COUNTS}
        return RunSummary(
            self.run_key, run.get("channel", {}).get("S", ""), partitions, len(records),
            int(run.get("attempts", {}).get("N", 0)), counts,
            float(run.get("created_at", {}).get("N", 0)),
            {name: int(run[f"last_{name}"]["N"]) for name in COUNTS if f"last_{name}" in run})

    def _records(self, partitions: int) -> list[PartitionRecord]:
        self._table.ensure()
        keys = [self.partition_key(index) for index in range(partitions)]
        records: list[PartitionRecord] = []
        for first in range(0, len(keys), MAX_BATCH_GET):
            pending: dict[str, Any] = {self._table.name: {"Keys": [
                {"dedup_key": {"S": key}} for key in keys[first:first + MAX_BATCH_GET]],
                "ConsistentRead": True}}
            while pending:
                answer = call_with_budget(
                    functools.partial(self.clients.client("dynamodb").batch_get_item,
                                      RequestItems=pending),
                    self.settings.retry_budget_seconds, f"reading run {self.run_key!r}")
                records += [_record(item) for item in
                            answer.get("Responses", {}).get(self._table.name, [])]
                pending = answer.get("UnprocessedKeys") or {}
        return sorted(records, key=lambda record: record.index)


def _record(item: Mapping[str, Any]) -> PartitionRecord:
    return PartitionRecord(
        int(item["partition"]["N"]), item["fingerprint"]["S"],
        {name: int(item[name]["N"]) for name in COUNTS if name in item},
        float(item.get("finished_at", {}).get("N", 0)))
