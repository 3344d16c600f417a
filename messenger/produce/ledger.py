"""What a publishing run has published, per partition, so that a retried task or a re-run of the
same run skips the rows it already sent (FIFO deduplication lasts only 5 minutes).

    <location>/<run id>/<partitions>-<index>/<sequence>.json

Each object lists the digests of rows one partition published (`item_digest`), written every
`FLUSH_ROWS` published rows and when the partition ends; a partition reads its own objects when it
starts. `location` is `s3://bucket/prefix` (boto3, the executors' credentials) or a local folder
(local mode). Rows map to partitions by hashing their key columns into a fixed number of
partitions, so a re-run with the same input and `partitions` gives each row the same partition.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from messenger.aws import ClientFactory
from messenger.errors import InvalidSettings
from messenger.produce.push import PushItem

#: Published rows recorded per ledger object (a few objects per partition, ~1 % of requests).
FLUSH_ROWS = 1_000
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,127}$")
_S3_SCHEMES = ("s3://", "s3a://", "s3n://")


def item_digest(item: PushItem) -> str:
    """A row's identity as published: body, routing key, group and dedup id (32 hex chars)."""
    text = json.dumps(
        [item.body, item.routing_key, item.group_id, item.dedup_id],
        sort_keys=True, separators=(",", ":"), default=str,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class Ledger:
    """The ledger of one run: where it lives, the run id, the number of publishing partitions."""

    location: str
    run_id: str
    partitions: int

    def __post_init__(self) -> None:
        if not RUN_ID.match(self.run_id):
            raise InvalidSettings(
                f"run_id must be 1 to 128 letters, digits, '.', '_', '=' or '-' (starting with a "
                f"letter or digit), got {self.run_id!r}"
            )
        if "://" in self.location and not self.location.startswith(_S3_SCHEMES):
            raise InvalidSettings(
                f"ledger must be an s3:// URI or a local folder, got {self.location!r}"
            )

    @property
    def _run_prefix(self) -> str:
        return f"{self.location.rstrip('/')}/{self.run_id}"

    def check(self, clients: ClientFactory) -> None:
        """On the driver: a run recorded with another number of partitions cannot be resumed
        (its rows would map to other partitions)."""
        others = sorted(
            {name.split("-")[0] for name in _list_dirs(self._run_prefix, clients)}
            - {str(self.partitions)}
        )
        if others:
            raise InvalidSettings(
                f"run {self.run_id!r} was published with partitions={', '.join(others)} (ledger "
                f"{self._run_prefix}); re-run it with the same partitions, or use a new run_id"
            )

    def partition(self, index: int, clients: ClientFactory) -> PartitionLedger:
        prefix = f"{self._run_prefix}/{self.partitions}-{index}"
        return PartitionLedger(prefix, clients, published=_read_all(prefix, clients))


@dataclass
class PartitionLedger:
    """One partition's record: `published` (read at start), `record()` as batches succeed."""

    prefix: str
    clients: ClientFactory
    published: set[str] = field(default_factory=set)
    _pending: list[str] = field(default_factory=list)
    _sequence: int = 0

    def __post_init__(self) -> None:
        # Continue after the objects of earlier attempts: never overwrite one.
        self._sequence = len(_list_files(self.prefix, self.clients))

    def record(self, digests: Iterable[str]) -> None:
        self._pending.extend(digests)
        if len(self._pending) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        body = json.dumps(self._pending, separators=(",", ":"))
        _write(f"{self.prefix}/{self._sequence:06d}.json", body, self.clients)
        self.published.update(self._pending)
        self._pending, self._sequence = [], self._sequence + 1


# -- storage: S3 or a local folder ---------------------------------------------------------------
def _split_s3(uri: str) -> tuple[str, str] | None:
    for scheme in _S3_SCHEMES:
        if uri.startswith(scheme):
            bucket, _, key = uri[len(scheme):].partition("/")
            return bucket, key
    return None


def _local(uri: str) -> Path:
    return Path(uri[len("file://"):] if uri.startswith("file://") else uri)


def _list_files(prefix: str, clients: ClientFactory) -> list[str]:
    s3 = _split_s3(prefix)
    if s3 is None:
        folder = _local(prefix)
        return sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []
    bucket, key = s3
    pages = clients.client("s3").get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{key}/"
    )
    return sorted(o["Key"].rsplit("/", 1)[-1] for page in pages for o in page.get("Contents", []))


def _list_dirs(prefix: str, clients: ClientFactory) -> list[str]:
    s3 = _split_s3(prefix)
    if s3 is None:
        folder = _local(prefix)
        return [p.name for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    bucket, key = s3
    pages = clients.client("s3").get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{key}/", Delimiter="/"
    )
    return [
        common["Prefix"].rstrip("/").rsplit("/", 1)[-1]
        for page in pages for common in page.get("CommonPrefixes", [])
    ]


def _read_all(prefix: str, clients: ClientFactory) -> set[str]:
    found: set[str] = set()
    s3 = _split_s3(prefix)
    for name in _list_files(prefix, clients):
        if s3 is None:
            text = (_local(prefix) / name).read_text(encoding="utf-8")
        else:
            bucket, key = s3
            text = clients.client("s3").get_object(
                Bucket=bucket, Key=f"{key}/{name}"
            )["Body"].read().decode("utf-8")
        found.update(json.loads(text))
    return found


def _write(uri: str, body: str, clients: ClientFactory) -> None:
    s3 = _split_s3(uri)
    if s3 is not None:
        bucket, key = s3
        clients.client("s3").put_object(Bucket=bucket, Key=key, Body=body.encode("utf-8"),
                                        ContentType="application/json")
        return
    path = _local(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a killed task leaves no half-written record.
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(body)
    os.replace(temporary, path)
