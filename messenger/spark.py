"""Publish a DataFrame's rows to a channel from the Spark executors.

    report = publish(
        drops, PriceDropProducer,
        body=["user_id", "item_id", "old_price", "new_price"],
        routing_key="routing_key",           # a column, or a function of the Row
        group_id="user_id",                  # the FIFO group (ordered) or fair-queue tenant
        dedup_key=["user_id", "item_id", "price_date"],   # ordered: dedup id = sha256 of these
        failed_path="s3://bucket/failed/2026-11-21",
    )
    sys.exit(report.exit_code)               # non-zero when any row failed

Each partition builds its own producer from `ExecutorSettings` shipped in the task closure
(settings, region, endpoint): nothing depends on driver-only globals or the executors' environment.
Rows go out with `push_many` in batches of 10 (SendMessageBatch / PublishBatch), a few batches in
flight per partition (one lane per message group), large bodies offloaded to S3, transient
per-entry failures retried within the retry budget. Rows that still
fail are written, with the reason, to `failed_path` (JSON lines) by the same Spark action that
publishes, so publishing runs exactly once per task attempt and nothing is dropped silently.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import os
import sys
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Union

from messenger.aws import ClientFactory, RequestCounter, error_code
from messenger.channel import MAX_BATCH_ENTRIES
from messenger.errors import InvalidSettings
from messenger.jobs.dedup import check_window
from messenger.jobs.runs import (
    DEFAULT_RUN_WINDOW_SECONDS,
    Fingerprint,
    PartitionRecord,
    RunLedger,
    check_run_key,
    job_id,
)
from messenger.produce.ledger import Ledger, PartitionLedger, item_digest
from messenger.produce.producer import MultiProducer, Producer, PushItem
from messenger.settings import Settings
from messenger.tracing import current_headers

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Columns added to each row written to the failed-rows output.
FAILURE_CODE_COLUMN = "_failure_code"
FAILURE_REASON_COLUMN = "_failure_reason"
#: After this many batches in a row fail as a whole (channel gone, access denied, endpoint down),
#: a partition stops calling AWS and writes its remaining rows to the failed output.
MAX_CONSECUTIVE_BATCH_ERRORS = 3
#: Failure codes that say the channel, not the message, is the problem.
_CHANNEL_FAILURE_CODES = frozenset({"PublishFailed", "ChannelNotFound", "ProvisioningError"})
NOT_ATTEMPTED = "NotAttempted"
#: Batches a partition has in flight at once (each lane sends its batches in order).
DEFAULT_LANES = 4
MAX_LANES = 16
#: Publishing partitions (tasks) at most; the default is the cluster's default parallelism.
MAX_PARTITIONS = 10_000
#: Counters (Spark accumulators) a publishing task adds to.
COUNTERS = ("published", "offloaded", "failed", "requests", "skipped", "partitions",
            "duplicates", "partitions_skipped", "dynamodb_requests")
#: Rows per push_many call with a run key: its claims are marked sent in BatchWriteItems of 25,
#: so 50 rows cost 50 conditional PutItems and 2 batch writes (1.04 DynamoDB requests per row)
#: and 5 SendMessageBatch/PublishBatch requests, as 5 calls of 10 would.
RUN_CHUNK_ROWS = 50

#: A column name, or a function of the Row (`Union`: evaluated at import, on Python 3.9 too).
RowField = Union[str, Callable[[Any], Any]]
#: A producer class: a `Producer` (queue) or `MultiProducer` (exchange) subclass.
ProducerClass = Union[type[Producer], type[MultiProducer]]


@dataclass(frozen=True)
class ExecutorSettings:
    """What an executor needs to build its producer, shipped from the driver in the closure.

    settings: the messenger settings (namespace, provisioning, region, offload bucket, ...).
    endpoint_url: AWS endpoint (None: boto3's own resolution; set for moto or LocalStack).
    Credentials are not shipped: executors use the default chain (the EMR instance profile).
    """

    settings: Settings
    endpoint_url: str | None = None

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        endpoint_url: str | None = None,
        **overrides: Any,
    ) -> ExecutorSettings:
        """Settings read on the driver (see `Settings.from_env`) plus `AWS_ENDPOINT_URL`."""
        env = os.environ if environ is None else environ
        return cls(
            settings=Settings.from_env(env, **overrides),
            endpoint_url=endpoint_url or env.get("AWS_ENDPOINT_URL") or None,
        )

    def client_factory(self) -> ClientFactory:
        """The executor process's clients for this region and endpoint, made once: a Python
        worker runs many tasks, and making boto3 clients costs more than a batch request."""
        key = (self.settings.region, self.endpoint_url)
        with _factories_lock:
            factory = _factories.get(key)
            if factory is None:
                factory = _factories[key] = ClientFactory(*key)
            return factory


_factories: dict[tuple[str, str | None], ClientFactory] = {}
_factories_lock = threading.Lock()


@dataclass(frozen=True)
class PublishReport:
    """What `publish` did. failed rows are in `failed_path`; requests counts every AWS call;
    skipped: rows the run's ledger showed as already published, or (with a run key) rows an
    earlier attempt of the run sent: those of the partitions it finished (`partitions_skipped`,
    not read row by row) and those the dedup table holds; partitions: partitions that published
    (or skipped) at least one row; duplicates: rows not sent because their deduplication key
    was sent within SQS's 5 minutes (SQS would drop them; ordered channels), with the producer's
    `dedup`, their message id within its window, or with a run key, rows whose key columns
    repeat an earlier row's; dynamodb_requests: the executors' DynamoDB requests (claims,
    marks, the run's ledger), part of `requests`."""

    published: int
    offloaded: int
    failed: int
    requests: int
    failed_path: str
    skipped: int = 0
    partitions: int = 0
    run_id: str | None = None
    duplicates: int = 0
    run_key: str | None = None
    partitions_skipped: int = 0
    dynamodb_requests: int = 0

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    @property
    def requests_per_message(self) -> float:
        return self.requests / self.published if self.published else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RowMapping:
    """How a Row becomes a PushItem (see `publish` for the meaning of each field)."""

    body: RowField | Sequence[str] | None = None
    routing_key: RowField | None = None
    group_id: RowField | None = None
    dedup_key: Sequence[str] | Callable[[Any], Any] | None = None
    #: With a run key, each row's job id is derived from it and the row's key columns
    #: (`dedup_key`, else every column) and the row is pushed with dedup on enqueue.
    run_key: str | None = None

    def check(self, columns: Sequence[str], producer_class: ProducerClass) -> None:
        """Fail on the driver, before any task runs, naming the bad argument."""
        for name, value in (
            ("body", self.body), ("routing_key", self.routing_key),
            ("group_id", self.group_id), ("dedup_key", self.dedup_key),
        ):
            if value is None or callable(value):
                continue
            names = [value] if isinstance(value, str) else list(value)
            missing = [column for column in names if column not in columns]
            if missing:
                raise InvalidSettings(
                    f"publish({name}=...): no column {', '.join(map(repr, missing))}; the "
                    f"DataFrame has {', '.join(columns)}"
                )
        if not producer_class.ordered and self.dedup_key is not None and self.run_key is None:
            raise InvalidSettings(
                f"publish(dedup_key=) applies to ordered channels, or with a run_key; "
                f"{producer_class.__name__}.channel {producer_class.channel!r} is not ordered"
            )

    def item(self, row: Any) -> PushItem:
        if self.run_key is not None:  # the job id is the message id, and on FIFO the dedup id
            return PushItem(
                body=self._body(row),
                routing_key=_text(_field(row, self.routing_key)),
                group_id=_text(_field(row, self.group_id)),
                message_id=self.job_id(row),
                dedup=True,
            )
        return PushItem(
            body=self._body(row),
            routing_key=_text(_field(row, self.routing_key)),
            group_id=_text(_field(row, self.group_id)),
            dedup_id=self._dedup_id(row),
        )

    def job_id(self, row: Any) -> str:
        """The row's job id in its run: '<run key>:<digest of the run key and key columns>'."""
        assert self.run_key is not None
        return job_id(self.run_key, self._key_text(row) if self.dedup_key is not None
                      else _json_text(plain(row)))

    def _body(self, row: Any) -> Any:
        if self.body is None:
            return plain(row)
        if isinstance(self.body, str):
            return plain(row[self.body])
        if callable(self.body):
            return self.body(row)
        return {column: plain(row[column]) for column in self.body}

    def _dedup_id(self, row: Any) -> str | None:
        if self.dedup_key is None:
            return None
        return hashlib.sha256(self._key_text(row).encode("utf-8")).hexdigest()

    def _key_text(self, row: Any) -> str:
        if callable(self.dedup_key):
            return _json_text(plain(self.dedup_key(row)))
        assert self.dedup_key is not None
        columns = [self.dedup_key] if isinstance(self.dedup_key, str) else self.dedup_key
        return _json_text([plain(row[column]) for column in columns])


def _json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def plain(value: Any) -> Any:
    """A Spark value as JSON-ready data: Rows become dicts, dates ISO 8601 strings,
    decimals exact strings; anything else is left for the encoder to accept or reject."""
    if hasattr(value, "asDict"):
        return {key: plain(item) for key, item in value.asDict().items()}
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def _field(row: Any, spec: RowField | None) -> Any:
    if spec is None:
        return None
    return spec(row) if callable(spec) else row[spec]


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class RunSpec:
    """A run key's publishing (shipped to the executors; see `messenger.jobs.runs`): the
    channel, the number of partitions and the window, in seconds, its rows count as sent."""

    run_key: str
    channel: str
    partitions: int
    window_seconds: int = DEFAULT_RUN_WINDOW_SECONDS

    def ledger(self, clients: ClientFactory, settings: Settings) -> RunLedger:
        return RunLedger(clients, settings, self.run_key, self.channel, self.partitions,
                         self.window_seconds)


@dataclass
class _BatchOutcome:
    failures: list[tuple[Any, str, str]]
    published: int = 0
    offloaded: int = 0
    channel_error: bool = False
    digests: list[str] = field(default_factory=list)  # of the published rows (with a ledger)
    duplicates: int = 0


class PartitionPublisher:
    """The function run on each partition: one producer, batches of 10, failed rows yielded.

    Batches go out on `lanes` threads: a row's lane is fixed by its message group, and each lane
    sends its batches one after the other, so a group's order is kept while requests of other
    groups overlap (AWS calls are latency-bound). counters: Spark accumulators named as in
    `COUNTERS`. ledger: the run's record; rows it lists are skipped, published ones added.
    run: a run key's publishing: rows go with dedup on enqueue for its window, in push_many
    calls of RUN_CHUNK_ROWS, and a partition its ledger lists as finished is skipped whole.
    """

    def __init__(
        self,
        producer_class: ProducerClass,
        executor: ExecutorSettings,
        mapping: RowMapping,
        counters: Mapping[str, Any],
        lanes: int = DEFAULT_LANES,
        ledger: Ledger | None = None,
        trace_parent: Mapping[str, str] | None = None,
        run: RunSpec | None = None,
    ) -> None:
        self.producer_class = producer_class
        #: The driver's trace context (W3C headers): each row's message is created in it.
        self.trace_parent = dict(trace_parent or {})
        self.executor = executor
        self.mapping = mapping
        self.counters = counters
        self.lanes = lanes
        self.ledger = ledger
        self.run = run

    def __call__(self, index: int, rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        """Publish partition `index` (Spark's mapPartitionsWithIndex)."""
        clients = self.executor.client_factory()
        requests = RequestCounter().attach(clients)
        lanes = [ThreadPoolExecutor(max_workers=1) for _ in range(self.lanes)]
        producer = None
        try:
            run = None if self.run is None else self.run.ledger(clients, self.executor.settings)
            finished = None if run is None else run.finished(index)
            if finished is not None:
                yield from self._skip(index, iter(rows), finished)
                return
            ledger = None if self.ledger is None else self.ledger.partition(index, clients)
            producer = self._producer_class()(settings=self.executor.settings, clients=clients)
            producer.trace_parent = self.trace_parent
            yield from self._publish(producer, iter(rows), lanes, ledger, run, index)
        finally:
            for lane in lanes:
                lane.shutdown(wait=True)
            if producer is not None and producer.status is not None:
                # Every QUEUED record of the partition, the last partial batch included.
                producer.status.close()
            requests.detach(clients)
            self.counters["requests"].add(requests.total)
            self.counters["dynamodb_requests"].add(sum(
                count for key, count in requests.counts.items() if key.startswith("dynamodb.")))

    def _producer_class(self) -> ProducerClass:
        """The producer class, with a run key: a subclass whose dedup window is the run's."""
        if self.run is None:
            return self.producer_class
        return type(self.producer_class.__name__, (self.producer_class,),
                    {"dedup_window": self.run.window_seconds,
                     "__module__": self.producer_class.__module__})

    def _skip(self, index: int, rows: Iterator[Any], finished: PartitionRecord
              ) -> Iterator[tuple[Any, ...]]:
        """A partition an earlier attempt of the run finished: no row is sent or looked up in
        the dedup table; its rows' job ids are compared with those it finished with."""
        assert self.run is not None
        fingerprint = Fingerprint()
        for row in rows:
            fingerprint.add(self.mapping.job_id(row))
        if fingerprint.text() != finished.fingerprint:
            raise InvalidSettings(
                f"run_key {self.run.run_key!r}: partition {index} holds other rows than the "
                f"attempt that finished it ({fingerprint.rows} now, {finished.rows} then: the "
                f"input changed); publish a changed input with a new run_key"
            )
        self.counters["skipped"].add(fingerprint.rows)
        self.counters["partitions"].add(1 if fingerprint.rows else 0)
        self.counters["partitions_skipped"].add(1)
        yield from ()

    def _publish(
        self, producer: Producer | MultiProducer, rows: Iterator[Any],
        lanes: list[ThreadPoolExecutor], ledger: PartitionLedger | None,
        run: RunLedger | None = None, index: int = 0,
    ) -> Iterator[tuple[Any, ...]]:
        counts = {"published": 0, "offloaded": 0, "failed": 0, "skipped": 0, "partitions": 0,
                  "duplicates": 0}
        chunk = RUN_CHUNK_ROWS if run is not None else MAX_BATCH_ENTRIES
        fingerprint = Fingerprint()
        seen: set[str] = set()  # job ids of this partition (with a run key)
        batches: list[list[tuple[Any, PushItem]]] = [[] for _ in lanes]
        in_flight: deque[Future[_BatchOutcome]] = deque()
        batch_errors, last_error = 0, ""

        def settle(outcome: _BatchOutcome, sent: bool = True) -> Iterator[tuple[Any, ...]]:
            nonlocal batch_errors, last_error
            counts["published"] += outcome.published
            # With a run key, a duplicate is a row an earlier attempt sent (those repeating a
            # row of this partition are counted, and left out, before they are pushed).
            counts["skipped" if run is not None else "duplicates"] += outcome.duplicates
            counts["offloaded"] += outcome.offloaded
            counts["failed"] += len(outcome.failures)
            if ledger is not None:
                ledger.record(outcome.digests)
            if sent:
                batch_errors = batch_errors + 1 if outcome.channel_error else 0
            for row, code, reason in outcome.failures:
                if sent:
                    last_error = f"{code}: {reason}"
                yield failed_row(row, code, reason)

        def send(lane: int) -> Iterator[tuple[Any, ...]]:
            batch, batches[lane] = batches[lane], []
            if batch_errors >= MAX_CONSECUTIVE_BATCH_ERRORS:
                # The channel is unusable: keep the rest for a rerun instead of hammering AWS.
                reason = f"after repeated errors: {last_error}"
                not_attempted = [(row, NOT_ATTEMPTED, reason) for row, _ in batch]
                yield from settle(_BatchOutcome(not_attempted), sent=False)
                return
            in_flight.append(lanes[lane].submit(self._send, producer, batch, ledger is not None))
            while len(in_flight) > 2 * len(lanes):
                yield from settle(in_flight.popleft().result())

        rotation = 0
        for row in rows:
            counts["partitions"] = 1
            try:
                item = self.mapping.item(row)
            except Exception as error:  # the user's mapping failed on this row: keep the row
                failure = (row, type(error).__name__, str(error))
                yield from settle(_BatchOutcome([failure]), sent=False)
                continue
            if run is not None:  # every row counts in the fingerprint, skipped ones too
                assert item.message_id is not None
                fingerprint.add(item.message_id)
                if item.message_id in seen:  # the same key columns as an earlier row
                    counts["duplicates"] += 1
                    continue
                seen.add(item.message_id)
            if ledger is not None and item_digest(item) in ledger.published:
                counts["skipped"] += 1  # published by an earlier attempt of this run
                continue
            if producer.ordered:  # a group always takes the same lane: its order is kept
                group = (item.group_id or "").encode("utf-8")
                lane = zlib.crc32(group) % len(lanes)
            else:
                lane = rotation // chunk % len(lanes)
                rotation += 1
            batches[lane].append((row, item))
            if len(batches[lane]) == chunk:
                yield from send(lane)
        for lane, batch in enumerate(batches):
            if batch:
                yield from send(lane)
        while in_flight:
            yield from settle(in_flight.popleft().result())
        if ledger is not None:
            ledger.flush()
        if run is not None and not counts["failed"]:
            # Every row sent (now or by an earlier attempt): a re-run skips the partition whole.
            run.finish(index, fingerprint, counts)
        for name, value in counts.items():
            self.counters[name].add(value)

    @staticmethod
    def _send(
        producer: Producer | MultiProducer, batch: list[tuple[Any, PushItem]],
        digests: bool = False,
    ) -> _BatchOutcome:
        """Publish a chunk of rows (10, or RUN_CHUNK_ROWS with a run key); channel_error: the
        whole chunk failed for a channel reason; digests: also return those of the published
        rows (for the ledger)."""
        try:
            result = producer.push_many([item for _, item in batch])
        except Exception as error:  # neither retryable nor per entry (e.g. AccessDenied)
            code = error_code(error) or type(error).__name__
            return _BatchOutcome([(row, code, str(error)) for row, _ in batch], channel_error=True)
        failures = [(batch[f.index][0], f.code, f.reason) for f in result.failures]
        channel_error = not result.published and all(
            failure.code in _CHANNEL_FAILURE_CODES for failure in result.failures
        )
        published: list[str] = []
        if digests:
            failed = {failure.index for failure in result.failures}
            published = [item_digest(item) for n, (_, item) in enumerate(batch) if n not in failed]
        return _BatchOutcome(failures, result.published, result.offloaded, channel_error, published,
                             duplicates=len(result.duplicates))


def failed_row(row: Any, code: str, reason: str) -> tuple[Any, ...]:
    return (*tuple(row), code, reason)


def publish(
    df: DataFrame,
    producer_class: ProducerClass,
    *,
    failed_path: str,
    body: RowField | Sequence[str] | None = None,
    routing_key: RowField | None = None,
    group_id: RowField | None = None,
    dedup_key: Sequence[str] | Callable[[Any], Any] | None = None,
    order_by: Sequence[str] = (),
    executor: ExecutorSettings | None = None,
    lanes: int = DEFAULT_LANES,
    partitions: int | None = None,
    run_id: str | None = None,
    ledger: str | None = None,
    run_key: str | None = None,
    run_window: datetime.timedelta | int = DEFAULT_RUN_WINDOW_SECONDS,
) -> PublishReport:
    """Publish every row of `df` to `producer_class`'s channel; returns the counts.

    failed_path: where rows that could not be published are written (JSON lines, the row's
        columns plus `_failure_code` and `_failure_reason`). Any Spark path: local, hdfs://,
        s3://. A completed earlier output there (`_SUCCESS`) is never overwritten (error); what
        a killed run left (`_temporary/`, part files, no `_SUCCESS`) is replaced.
    body: None (the whole row as an object), a column, a list of columns, or a function of
        the Row. Dates become ISO 8601 strings, decimals exact strings.
    routing_key: a column or a function of the Row (None: no routing key).
    group_id: a column or function (e.g. 'user_id'). Ordered channels: the FIFO message
        group; a column's rows are partitioned by it so each group is published by one task, in
        order. Standard channels: the fair-queue tenant key (rows are not partitioned by it).
    dedup_key: columns (or a function) identifying a row. Ordered channels: the message
        deduplication id is their sha256, so a rerun within 5 minutes publishes nothing twice
        (None: the sha256 of the message content: group, routing key, headers, priority, body).
        With a run_key (any channel): the row's job id is derived from the run key and them.
    order_by: columns giving the order of messages within a group (sorted per partition).
    executor: settings shipped to the executors (default: `ExecutorSettings.from_env()`).
    lanes: batches a partition sends at once (1 to 16, default 4); a message group always
        uses the same lane, so its order is kept.
    partitions: publishing tasks (1 to 10,000; default: the cluster's default parallelism,
        on EMR its executors' cores). Set explicitly with `repartition(n, ...)`, which adaptive
        query execution does not coalesce, so every executor publishes whatever the data size.
    run_id, ledger: give both for re-runs that publish nothing twice, however late: each
        partition records the rows it published under `<ledger>/<run_id>/` (an s3:// URI or a
        local folder) and skips them when the run is retried or re-run. Rows are partitioned by
        their key (group_id, dedup_key or all columns), so a re-run must use the same
        `partitions` (checked).
    run_key: a re-runnable run (1 to 80 letters, digits, '.', '_', '=', '-'), on standard and
        ordered channels: each row's job id (its message id, and FIFO deduplication id) is
        '<run_key>:<digest of run_key and the dedup_key columns (None: all columns)>', and rows
        are pushed with dedup on enqueue (`messenger.jobs.dedup`) for `run_window`, so a re-run
        with the same run key sends only the rows no earlier attempt sent. A partition whose
        rows were all sent is recorded in the run's ledger (`messenger.jobs.runs`), and a
        re-run skips it whole without a read per row. Rows are partitioned by their key, so a
        re-run must use the same channel and `partitions` (checked). `messenger emr run
        <run_key>` shows the run's counts.
    run_window: how long a run's rows count as sent (seconds or a timedelta, 1 s to 14 days;
        default 7 days).
    producer_class must be importable on the executors: defined in the job script itself or in
    a module shipped with --py-files.
    """
    from pyspark.sql.types import MapType, StringType, StructField, StructType

    if not 1 <= lanes <= MAX_LANES:
        raise InvalidSettings(f"publish(lanes=...) must be from 1 to {MAX_LANES}, got {lanes}")
    if (run_id is None) != (ledger is None):
        raise InvalidSettings("publish(run_id=, ledger=) go together: give both or neither")
    if run_key is not None:
        check_run_key(run_key)
    window = run_window
    if isinstance(window, datetime.timedelta):
        window = int(window.total_seconds()) if window.total_seconds().is_integer() else -1
    window = check_window(window, "publish(run_window=...)")
    mapping = RowMapping(body, routing_key, group_id, dedup_key, run_key)
    mapping.check(df.columns, producer_class)
    missing = [column for column in order_by if column not in df.columns]
    if missing:
        raise InvalidSettings(
            f"publish(order_by=...): no column {', '.join(map(repr, missing))}; the DataFrame "
            f"has {', '.join(df.columns)}"
        )
    spark = df.sparkSession
    count = spark.sparkContext.defaultParallelism if partitions is None else partitions
    if not 1 <= count <= MAX_PARTITIONS:
        raise InvalidSettings(
            f"publish(partitions=...) must be from 1 to {MAX_PARTITIONS}, got {partitions}"
        )
    executor = executor or ExecutorSettings.from_env()
    run_ledger = None
    if run_id is not None and ledger is not None:
        run_ledger = Ledger(ledger, run_id, count)
        run_ledger.check(executor.client_factory())
    run = None
    if run_key is not None:
        run = RunSpec(run_key, producer_class.channel, count, window)
        run.ledger(executor.client_factory(), executor.settings).start()
    # An explicit number of partitions: adaptive query execution keeps it (it coalesces only
    # shuffles whose number it chose), so all executors publish.
    if isinstance(group_id, str) and producer_class.ordered:
        df = df.repartition(count, group_id)
    elif run_ledger is not None or run is not None:
        # A row's partition must not depend on the input's order.
        if isinstance(dedup_key, str):
            keys = [dedup_key]
        elif dedup_key is not None and not callable(dedup_key):
            keys = list(dedup_key)
        else:
            keys = [f.name for f in df.schema.fields if not isinstance(f.dataType, MapType)]
        df = df.repartition(count, *keys)
    else:
        df = df.repartition(count)
    if order_by:
        df = df.sortWithinPartitions(*order_by)
    mode = failed_output_mode(spark, failed_path)
    counters = {name: spark.sparkContext.accumulator(0) for name in COUNTERS}
    # The driver's current trace context goes to the executors: each row's message carries it
    # (as the parent of the executor's spans when it traces too; `messenger.tracing`).
    task = PartitionPublisher(producer_class, executor, mapping, counters, lanes, run_ledger,
                              current_headers(executor.settings.tracing), run)
    schema = StructType(
        [
            *df.schema.fields,
            StructField(FAILURE_CODE_COLUMN, StringType(), False),
            StructField(FAILURE_REASON_COLUMN, StringType(), False),
        ]
    )
    # One action: publishing and writing the failed rows happen in the same tasks.
    spark.createDataFrame(df.rdd.mapPartitionsWithIndex(task), schema).write.mode(mode).json(
        failed_path
    )
    report = PublishReport(
        published=counters["published"].value,
        offloaded=counters["offloaded"].value,
        failed=counters["failed"].value,
        requests=counters["requests"].value,
        failed_path=failed_path,
        skipped=counters["skipped"].value,
        partitions=counters["partitions"].value,
        run_id=run_id,
        duplicates=counters["duplicates"].value,
        run_key=run_key,
        partitions_skipped=counters["partitions_skipped"].value,
        dynamodb_requests=counters["dynamodb_requests"].value,
    )
    if run is not None:
        run.ledger(executor.client_factory(), executor.settings).attempt_done(report.as_dict())
    return report


def failed_output_mode(spark: SparkSession, path: str) -> str:
    """The write mode for the failed rows at `path` (Hadoop's file system, so any Spark path):
    'errorifexists' for a new path, 'overwrite' for what a killed run left (no `_SUCCESS`, only
    `_temporary`, part files and hidden files); anything else is an error naming it."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    target = jvm.org.apache.hadoop.fs.Path(path)
    fs = target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(target):
        return "errorifexists"
    names = sorted(status.getPath().getName() for status in fs.listStatus(target))
    if "_SUCCESS" in names:
        raise InvalidSettings(
            f"failed_path {path!r} holds a completed run's failed rows (_SUCCESS); give a new "
            f"path (e.g. one per run or attempt)"
        )
    foreign = [n for n in names if not n.startswith(("_", ".", "part-"))]
    if foreign:
        raise InvalidSettings(
            f"failed_path {path!r} holds files no publish run wrote ({', '.join(foreign[:5])}); "
            f"give a new path"
        )
    return "overwrite"


def spark_session(app_name: str) -> SparkSession:
    """The job's SparkSession: spark-submit's, or when the job runs with plain `python`, a
    local one whose Python workers use this interpreter (the one with messenger installed)."""
    from pyspark.sql import SparkSession

    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return SparkSession.builder.appName(app_name).getOrCreate()
