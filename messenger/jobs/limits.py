"""Flow control's store: run-time limits per channel, the global rate limiter, concurrency
leases and what consumers report (their rate, the jobs waiting), in one DynamoDB table,
`limits_table_name(namespace)` (partition key `key` (S) only; TTL on `expires_at`).

Items (the `key` attribute):
- `limits#<channel>`: limits an operator set at run time (`LimitStore.set`): `rate_limit`,
  `tenant_rate_limit`, `max_concurrency` (each a value, or 'none': no limit), `set_by`,
  `set_at`, `version`. A limit not set there is the channel's declaration (its `ChannelSpec`,
  carried by its queue's tags).
- `rate#<channel>`: the channel's rate limiter: `tat` (N, epoch seconds: the virtual time up to
  which its rate is handed out); `rate#<channel>#tenant#<tenant>`: one tenant's (a fair
  queue's tenant key, a FIFO group).
- `concurrency#<channel>`: the concurrency lease: `h#<holder>` = {n, until} per process.
- `report#<channel>`: each consumer process's report, `p#<process>` = {r: jobs started per
  second lately, w: jobs waiting on a limit, t: when}.

**The rate limiter (GCRA, virtual time).** A limiter's `tat` is the time up to which its rate
has been handed out. A process reserves a batch of `n` units (a job is `Consumer.weight` units,
default 1) with one conditional UpdateItem: `SET tat = tat + n/rate` if `now - grace <= tat <=
now + horizon - n/rate` (busy), or `SET tat = now + n/rate` if `tat < now` or none (idle); a refused
condition returns the item (`ReturnValuesOnConditionCheckFailure`), so the next try knows the
right form and time without a read. The batch is the units of the virtual times [tat, tat + n /
rate): unit i belongs to time tat + i/rate, and a job starts at its unit's time, not before; a
unit not used within `UNIT_GRACE_SECONDS` after its time is dropped. Every process reads the
same `tat`, so starts follow one global sequence: in any window of W seconds at most rate × (W
+ UNIT_GRACE_SECONDS) + 1 jobs start (plus the largest weight, and rate × the clock skew of the
consumers' hosts), whatever the batch size, which sets only the cost: `batch_size(rate)` units a
request, so at a steady rate a channel's limiter costs 1 / batch UpdateItems per job (0.04 at
50/s) plus the refused ones (processes that asked while the horizon was full), a tenant's
1 / its batch (its rate × TENANT_BATCH_SECONDS, at least 1). A job woken later than its unit's
grace (a starved machine) is held back instead of crowding the next second.

**The store unavailable** (a limiter's UpdateItem failing past its budget, `STORE_BUDGET_SECONDS`):
the process uses the units it reserved already (they are counted in the store), then starts no
job of that limiter until the store answers again (`LimiterUnavailable`: the consumer holds
its jobs back, without an attempt, and tries the store again after `UNAVAILABLE_RETRY_SECONDS`).
So an outage never lets a channel exceed its limit: it slows it down, to a halt once the reserved
units are used (at most one batch per process). The run-time limits: the last ones read stay
(the declaration when none was ever read).
"""

from __future__ import annotations

import functools
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import (
    MAX_CONCURRENCY,
    TAG_MAX_CONCURRENCY,
    TAG_RATE_LIMIT,
    TAG_TENANT_RATE_LIMIT,
    ChannelSpec,
    Rate,
    limits_table_name,
    parse_rate,
)
from messenger.errors import InvalidSettings, MessengerError, RetryBudgetExhausted
from messenger.jobs.tables import EXPIRES_AT, ensure_table
from messenger.settings import Settings

#: The value that sets a limit off at run time (`LimitStore.set`), whatever the declaration.
UNLIMITED = "none"
#: The limits a channel has, by field name (`LimitStore.set`'s keywords, `ChannelLimits`).
LIMIT_FIELDS = ("rate_limit", "tenant_rate_limit", "max_concurrency")
#: Seconds a consumer trusts the limits it read: a limit changed at run time takes effect within
#: this plus the limiter's horizon (at most MAX_HORIZON_SECONDS ahead): 5 s.
REFRESH_SECONDS = 3.0
#: A channel limiter's batch covers this much of its rate (at least MIN_BATCH units).
BATCH_SECONDS = 0.5
MIN_BATCH = 10
#: A tenant limiter's batch: this much of the tenant's rate (at least 1 unit).
TENANT_BATCH_SECONDS = 0.5
#: Reservations reach ahead of now by two batches per process sharing the limiter, plus two (so
#: that each process can book its next batch while it uses one: few refused requests at a
#: steady rate), at least 2 batches, at most MAX_HORIZON_SECONDS (the limiter's horizon).
MIN_HORIZON_BATCHES = 2
MAX_HORIZON_SECONDS = 2.0
#: The longest jitter before a limiter asks again after refusals, in batches.
MAX_JITTER_BATCHES = 16
#: A unit not used within this long after its time is dropped (module doc: the window bound).
UNIT_GRACE_SECONDS = 0.25
#: A limiter's store call gives up after this long (then `LimiterUnavailable`).
STORE_BUDGET_SECONDS = 2.0
#: After the store failed, a limiter asks it again this long later (its jobs are held meanwhile).
UNAVAILABLE_RETRY_SECONDS = 2.0
#: Seconds a limiter item outlives its last use (TTL).
ITEM_TTL_SECONDS = 86_400
#: A process report older than this is not counted (`LimitStore.reported`), and is removed.
REPORT_FRESH_SECONDS = 30.0
#: A concurrency lease lasts this long unless renewed (a crashed holder's share frees then).
LEASE_SECONDS = 30.0

#: CloudWatch metrics the consumers publish (namespace, dimension `Channel`), one datum each per
#: METRICS_SECONDS: jobs started (Sum), jobs held back by a limit (Sum: each wait or delay), jobs
#: waiting on a limit (Maximum: in the consumers and back in their queue with a delay).
METRIC_NAMESPACE = "Messenger/FlowControl"
METRIC_DIMENSION = "Channel"
METRIC_STARTED = "JobsStarted"
METRIC_LIMITED = "JobsLimited"
METRIC_WAITING = "JobsWaiting"
METRICS_SECONDS = 60.0


class LimiterUnavailable(MessengerError):
    """The limits store could not be reached within its budget: no unit is handed out until it
    answers (the module doc's rule); `retry_at` is when to ask again (epoch seconds)."""

    def __init__(self, message: str, retry_at: float) -> None:
        super().__init__(message)
        self.retry_at = retry_at


@dataclass(frozen=True)
class ChannelLimits:
    """A channel's limits (None: no limit)."""

    rate_limit: Rate | None = None
    tenant_rate_limit: Rate | None = None
    max_concurrency: int | None = None

    @classmethod
    def of_spec(cls, spec: ChannelSpec) -> ChannelLimits:
        """A `ChannelSpec`'s declaration."""
        return cls(parse_rate(spec.rate_limit, "rate_limit") if spec.rate_limit else None,
                   parse_rate(spec.tenant_rate_limit, "tenant_rate_limit")
                   if spec.tenant_rate_limit else None, spec.max_concurrency)

    @classmethod
    def of_tags(cls, tags: Mapping[str, str]) -> ChannelLimits:
        """A queue's declaration (TAG_RATE_LIMIT, TAG_TENANT_RATE_LIMIT, TAG_MAX_CONCURRENCY);
        a tag that does not parse is no limit."""
        def rate(tag: str) -> Rate | None:
            try:
                return parse_rate(tags[tag], tag) if tag in tags else None
            except ValueError:
                return None

        concurrency = tags.get(TAG_MAX_CONCURRENCY, "")
        return cls(rate(TAG_RATE_LIMIT), rate(TAG_TENANT_RATE_LIMIT),
                   int(concurrency) if concurrency.isdigit() and
                   1 <= int(concurrency) <= MAX_CONCURRENCY else None)

    @property
    def limited(self) -> bool:
        return any(getattr(self, name) is not None for name in LIMIT_FIELDS)

    def as_text(self) -> dict[str, str | None]:
        """Each limit as written ('50/s', '10'), None for none."""
        return {name: None if getattr(self, name) is None else str(getattr(self, name))
                for name in LIMIT_FIELDS}


@dataclass(frozen=True)
class FlowReport:
    """What a channel's consumers reported lately (`LimitStore.reported`): jobs started per
    second (summed over processes), jobs waiting on a limit, the processes reporting, and the
    newest report's time (epoch seconds; 0: none)."""

    rate: float = 0.0
    waiting: int = 0
    processes: int = 0
    at: float = 0.0


@dataclass(frozen=True)
class LimitsView:
    """A channel's limits as `messenger limits show` prints them.

    limits: what holds now (each run-time value, else the declaration). declared: the
    channel's declaration. overrides: the run-time values set, by field ('none': set off).
    set_by / set_at: the last change (''/0: none). report: the consumers' latest reports."""

    channel: str
    limits: ChannelLimits
    declared: ChannelLimits
    overrides: dict[str, str] = field(default_factory=dict)
    set_by: str = ""
    set_at: float = 0.0
    report: FlowReport = FlowReport()

    def source(self, name: str) -> str:
        """Where a limit comes from: 'set' (at run time), 'declared' or '' (no limit)."""
        if name in self.overrides:
            return "set"
        return "declared" if getattr(self.declared, name) is not None else ""


def check_limit(name: str, value: object) -> str:
    """A run-time limit's value as stored: a rate ('N/s', 'N/min', 'N/h'), a concurrency (a
    whole number 1-10,000) or UNLIMITED; InvalidSettings naming the field and the allowed values
    otherwise."""
    if value == UNLIMITED:
        return UNLIMITED
    if name == "max_concurrency":
        if isinstance(value, bool) or not isinstance(value, (int, str)) or \
                not str(value).isdigit() or not 1 <= int(value) <= MAX_CONCURRENCY:
            raise InvalidSettings(f"max_concurrency must be a whole number from 1 to "
                                  f"{MAX_CONCURRENCY}, or '{UNLIMITED}', got {value!r}")
        return str(int(value))
    if name not in LIMIT_FIELDS:
        raise InvalidSettings(f"limit must be one of {', '.join(LIMIT_FIELDS)}, got {name!r}")
    try:
        return str(parse_rate(value, name))
    except ValueError:
        raise InvalidSettings(f"{name} must be 'N/s', 'N/min' or 'N/h' (N > 0, at most "
                              f"1000000/s), or '{UNLIMITED}', got {value!r}") from None


def _apply(declared: ChannelLimits, overrides: Mapping[str, str]) -> ChannelLimits:
    values: dict[str, Any] = {}
    for name in LIMIT_FIELDS:
        text = overrides.get(name)
        if text is None:
            values[name] = getattr(declared, name)
        elif text == UNLIMITED:
            values[name] = None
        elif name == "max_concurrency":
            values[name] = int(text)
        else:
            values[name] = parse_rate(text, name)
    return ChannelLimits(**values)


def batch_size(rate: Rate, tenant: bool = False, most: int | None = None) -> int:
    """Units one reservation takes: BATCH_SECONDS of the rate, at least MIN_BATCH (a tenant's:
    TENANT_BATCH_SECONDS of it, at least 1); at most `most` (a process's workers: units it
    cannot use before their time are lost)."""
    if tenant:
        size = max(1, math.ceil(rate.per_second * TENANT_BATCH_SECONDS))
    else:
        size = max(MIN_BATCH, math.ceil(rate.per_second * BATCH_SECONDS))
    return size if most is None else max(1, min(size, most))


def rate_key(channel: str, tenant: str | None = None) -> str:
    return f"rate#{channel}" if tenant is None else f"rate#{channel}#tenant#{tenant}"


class LimitStore:
    """The limits table: run-time limits per channel, and the consumers' reports.

    clients / settings: the table is `limits_table_name(settings.namespace)`. clock: epoch
    seconds (tests move one of their own). budget: seconds a call may retry (default the
    settings' retry budget)."""

    def __init__(self, clients: ClientFactory, settings: Settings,
                 clock: Callable[[], float] = time.time, budget: float | None = None,
                 dynamodb: Any = None) -> None:
        self.clients = clients
        self.settings = settings
        self.table = limits_table_name(settings.namespace)
        self.clock = clock
        self.budget = settings.retry_budget_seconds if budget is None else budget
        self._dynamodb = dynamodb

    @property
    def dynamodb(self) -> Any:
        if self._dynamodb is None:
            self._dynamodb = self.clients.client("dynamodb")
        return self._dynamodb

    def ensure(self) -> None:
        """Make the table in auto mode; check it exists in verify mode (ChannelNotFound)."""
        ensure_table(self.clients, self.settings, self.table, "limits", "key",
                     dynamodb=self.dynamodb)

    def _call(self, what: str, call: Callable[[], Any], budget: float | None = None) -> Any:
        return call_with_budget(call, self.budget if budget is None else budget, what)

    # -- run-time limits ---------------------------------------------------------------------
    def declared(self, channel: str) -> ChannelLimits:
        """A channel's declaration, from its queue's tags (the queue '<ns->channel', else its
        '.fifo' one); no limits when neither exists or their tags cannot be read."""
        sqs = self.clients.client("sqs")
        for ordered in (False, True):
            try:
                name = ChannelSpec(channel, ordered=ordered,
                                   namespace=self.settings.namespace).queue_name
                url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
                tags = sqs.list_queue_tags(QueueUrl=url).get("Tags") or {}
            except (ClientError, BotoCoreError, ValueError):
                continue
            return ChannelLimits.of_tags(tags)
        return ChannelLimits()

    def overrides(self, channel: str, budget: float | None = None) -> tuple[dict[str, str],
                                                                             str, float]:
        """The run-time values set for a channel (field → value or 'none'), who set them last
        and when (one consistent GetItem)."""
        item = self._call("reading the channel's limits", functools.partial(
            self.dynamodb.get_item, TableName=self.table,
            Key={"key": {"S": f"limits#{channel}"}}, ConsistentRead=True), budget).get("Item")
        if not item:
            return {}, "", 0.0
        values = {name: str(item[name]["S"]) for name in LIMIT_FIELDS if name in item}
        return values, str(item.get("set_by", {}).get("S", "")), \
            float(item.get("set_at", {}).get("N", "0"))

    def get(self, channel: str, declared: ChannelLimits | None = None,
            budget: float | None = None) -> ChannelLimits:
        """The limits that hold for a channel now: each one set at run time, else its
        declaration (`declared`; None: read from its queue's tags)."""
        values, _, _ = self.overrides(channel, budget)
        return _apply(self.declared(channel) if declared is None else declared, values)

    def set(self, channel: str, *, rate_limit: str | None = None,
            tenant_rate_limit: str | None = None, max_concurrency: int | str | None = None,
            by: str = "", clear: tuple[str, ...] = ()) -> LimitsView:
        """Set limits at run time (consumers follow within REFRESH_SECONDS + 1 s). Each keyword:
        None leaves it, a value sets it ('none', UNLIMITED: no limit whatever the declaration);
        `clear` names limits to give back to the declaration. by: who (the audit trail's
        actor). InvalidSettings naming the field for a bad value or name."""
        updates = {name: check_limit(name, value) for name, value in (
            ("rate_limit", rate_limit), ("tenant_rate_limit", tenant_rate_limit),
            ("max_concurrency", max_concurrency)) if value is not None}
        for name in clear:
            if name not in LIMIT_FIELDS:
                raise InvalidSettings(f"clear must name {', '.join(LIMIT_FIELDS)}, got {name!r}")
            if name in updates:
                raise InvalidSettings(f"{name} is both set and cleared")
        names: dict[str, str] = {"#by": "set_by", "#at": "set_at", "#v": "version"}
        values: dict[str, Any] = {":by": {"S": by or "unknown"},
                                  ":at": {"N": repr(self.clock())}, ":one": {"N": "1"}}
        sets = ["#by = :by", "#at = :at"]
        for index, (name, value) in enumerate(sorted(updates.items())):
            names[f"#f{index}"] = name
            values[f":f{index}"] = {"S": value}
            sets.append(f"#f{index} = :f{index}")
        expression = "SET " + ", ".join(sets) + " ADD #v :one"
        if clear:
            removed = []
            for index, name in enumerate(clear):
                names[f"#c{index}"] = name
                removed.append(f"#c{index}")
            expression += " REMOVE " + ", ".join(removed)
        self._call("setting the channel's limits", functools.partial(
            self.dynamodb.update_item, TableName=self.table,
            Key={"key": {"S": f"limits#{channel}"}}, UpdateExpression=expression,
            ExpressionAttributeNames=names, ExpressionAttributeValues=values))
        return self.show(channel)

    def show(self, channel: str) -> LimitsView:
        """A channel's limits, where each comes from, the last change and the latest reports."""
        declared = self.declared(channel)
        values, by, at = self.overrides(channel)
        return LimitsView(channel, _apply(declared, values), declared, values, by, at,
                          self.reported(channel))

    # -- the consumers' reports --------------------------------------------------------------
    def report(self, channel: str, process: str, rate: float, waiting: int,
               stale: tuple[str, ...] = ()) -> None:
        """One process's report (one UpdateItem): jobs started per second lately, jobs
        waiting on a limit now; `stale`: other processes' entries to remove."""
        now = self.clock()
        names = {"#me": f"p#{process}", "#exp": EXPIRES_AT}
        expression = "SET #me = :me, #exp = :exp"
        if stale:
            for index, other in enumerate(stale):
                names[f"#s{index}"] = f"p#{other}"
            expression += " REMOVE " + ", ".join(f"#s{i}" for i in range(len(stale)))
        self._call("reporting the channel's flow", functools.partial(
            self.dynamodb.update_item, TableName=self.table,
            Key={"key": {"S": f"report#{channel}"}}, UpdateExpression=expression,
            ExpressionAttributeNames=names, ExpressionAttributeValues={
                ":me": {"M": {"r": {"N": f"{rate:.3f}"}, "w": {"N": str(int(waiting))},
                              "t": {"N": f"{now:.3f}"}}},
                ":exp": {"N": str(int(now + ITEM_TTL_SECONDS))}}))

    def reports(self, channel: str) -> dict[str, tuple[float, int, float]]:
        """Every process's report: process → (rate, waiting, at), stale ones included."""
        item = self._call("reading the channel's flow", functools.partial(
            self.dynamodb.get_item, TableName=self.table,
            Key={"key": {"S": f"report#{channel}"}})).get("Item") or {}
        found = {}
        for name, value in item.items():
            if name.startswith("p#") and "M" in value:
                entry = value["M"]
                found[name[2:]] = (float(entry["r"]["N"]), int(entry["w"]["N"]),
                                   float(entry["t"]["N"]))
        return found

    def reported(self, channel: str) -> FlowReport:
        """The channel's current rate and jobs waiting: the sum of the reports fresher than
        REPORT_FRESH_SECONDS (FlowReport() when none)."""
        now = self.clock()
        fresh = [entry for entry in self.reports(channel).values()
                 if now - entry[2] <= REPORT_FRESH_SECONDS]
        if not fresh:
            return FlowReport()
        return FlowReport(sum(r for r, _, _ in fresh), sum(w for _, w, _ in fresh), len(fresh),
                          max(t for _, _, t in fresh))


@dataclass
class _Batch:
    """Units of one reservation: unit i at `start + i * interval` (epoch seconds)."""

    start: float
    interval: float
    left: int

    def take(self) -> float:
        at = self.start
        self.start += self.interval
        self.left -= 1
        return at


class RateLimiter:
    """One rate limit held across every consumer process (module doc): `take(units)` gives the
    time a job of that weight may start.

    store: the limits table. key: the limiter's item (`rate_key`). rate: its limit.
    tenant: a tenant's limiter (its batch size). clock: epoch seconds. draw: jitter, 0-1.
    most: the largest batch (the process's workers; None: no bound)."""

    def __init__(self, store: LimitStore, key: str, rate: Rate, tenant: bool = False,
                 clock: Callable[[], float] | None = None,
                 draw: Callable[[], float] = random.random, most: int | None = None) -> None:
        self.store = store
        self.key = key
        self.tenant = tenant
        self.most = most
        self.clock = clock or store.clock
        self.draw = draw
        self._lock = threading.Lock()
        self._batches: list[_Batch] = []
        #: The limiter's tat as last read: a lower bound of the store's (it only grows).
        self._known_tat: float | None = None
        #: Which form to try first when the known tat cannot tell (busy: other processes keep
        #: the limiter going): the form that worked last.
        self._busy_hint = False
        #: Refusals (horizon full) since the last reservation: the jitter of the next try.
        self._refusals = 0
        #: No store call before this (the horizon was full, or the store failed).
        self._ask_at = 0.0
        self._unavailable = False
        #: UpdateItems made (the bench and the tests read it).
        self.requests = 0
        #: Consumer processes sharing the limiter (the channel's reports), for the horizon.
        self.processes = 1
        self.rate = rate

    @property
    def rate(self) -> Rate:
        return self._rate

    @rate.setter
    def rate(self, rate: Rate) -> None:
        """A new limit (run-time change): new reservations use it; units already reserved stay
        (they reach at most the horizon ahead)."""
        self._rate = rate
        self.interval = 1.0 / rate.per_second

    @property
    def batch(self) -> int:
        """Units one reservation takes (`batch_size`, at most `most`)."""
        return batch_size(self._rate, self.tenant, self.most)

    @property
    def horizon(self) -> float:
        """How far ahead of now reservations reach (seconds; see MIN_HORIZON_BATCHES)."""
        span = self.batch * self.interval
        return max(MIN_HORIZON_BATCHES * span,
                   min(MAX_HORIZON_SECONDS, 2 * (self.processes + 1) * span))

    def take(self, units: int = 1) -> float | None:
        """When a job of `units` may start (epoch seconds, at most the horizon ahead; its last
        unit's time), its units taken; None when none can be had now (the horizon is full:
        `retry_at` says when to ask again). Raises LimiterUnavailable (the store failed)."""
        with self._lock:
            now = self.clock()
            at = self._local(units, now)
            if at is not None:
                return at
            if now < self._ask_at:
                if self._unavailable:
                    raise LimiterUnavailable(f"limits store unavailable ({self.key})",
                                             self._ask_at)
                return None
            if not self._reserve(max(self.batch, units), now):
                return None
            return self._local(units, self.clock())

    @property
    def retry_at(self) -> float:
        """When a refused `take` may succeed (epoch seconds)."""
        return self._ask_at

    def _local(self, units: int, now: float) -> float | None:
        """`units` from the reserved batches (dropping units past their grace); their last
        unit's time, or None when there are not that many."""
        batches = self._batches
        while batches and (batches[0].left <= 0 or
                           batches[0].start + (batches[0].left - 1) * batches[0].interval
                           < now - UNIT_GRACE_SECONDS):
            batches.pop(0)
        if batches and batches[0].start < now - UNIT_GRACE_SECONDS:  # some units too late
            first = batches[0]
            late = math.ceil((now - UNIT_GRACE_SECONDS - first.start) / first.interval)
            first.start += late * first.interval
            first.left -= late
        if sum(b.left for b in batches) < units:
            return None
        at = 0.0
        for _ in range(units):
            while batches[0].left <= 0:
                batches.pop(0)
            at = batches[0].take()
        return at

    def _reserve(self, units: int, now: float) -> bool:
        """One or two conditional UpdateItems for `units`; False when the horizon is full."""
        span = units * self.interval
        for _ in range(2):
            tat = self._known_tat
            if tat is not None and tat > now + self.horizon - span:  # (the store's is later)
                self._wait_for(tat, span, now)
                return False
            floor = now - UNIT_GRACE_SECONDS
            busy = (tat is not None and tat >= floor) or self._busy_hint
            if busy:
                # After the last units handed out; a tat gone further into the past than a
                # unit's grace is idle (the other form): no unit is handed out already late.
                expression = "SET tat = tat + :span, #exp = :exp"
                condition = "tat BETWEEN :floor AND :edge"
                values = {":span": {"N": repr(span)}, ":floor": {"N": repr(floor)},
                          ":edge": {"N": repr(now + self.horizon - span)}}
            else:  # idle (or not known): from now on
                expression = "SET tat = :fresh, #exp = :exp"
                condition = "attribute_not_exists(tat) OR tat < :now"
                values = {":fresh": {"N": repr(now + span)}, ":now": {"N": repr(now)}}
            values[":exp"] = {"N": str(int(now + ITEM_TTL_SECONDS))}
            self.requests += 1
            try:
                answer = call_with_budget(functools.partial(
                    self.store.dynamodb.update_item, TableName=self.store.table,
                    Key={"key": {"S": self.key}}, ExpressionAttributeNames={"#exp": EXPIRES_AT},
                    UpdateExpression=expression, ConditionExpression=condition,
                    ExpressionAttributeValues=values, ReturnValues="UPDATED_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD"),
                    STORE_BUDGET_SECONDS, "reserving rate units")
            except ClientError as error:
                if error_code(error) != "ConditionalCheckFailedException":
                    return self._failed(error, now)
                item = error.response.get("Item") or {}
                self._known_tat = float(item["tat"]["N"]) if "tat" in item else None
                self._busy_hint = not busy
                continue
            except (RetryBudgetExhausted, BotoCoreError) as error:
                return self._failed(error, now)
            self._unavailable = False
            self._busy_hint = busy
            self._refusals = 0
            new = float(answer["Attributes"]["tat"]["N"])
            self._known_tat = new
            self._batches.append(_Batch(new - span, self.interval, units))
            return True
        tat = self._known_tat
        self._wait_for(tat if tat is not None else now, span, now)
        return False

    def _wait_for(self, tat: float, span: float, now: float) -> None:
        """The horizon is full up to `tat`: ask again once a batch fits, after a jitter that
        doubles with each refusal since this process's last reservation, up to a batch per
        process sharing the limiter (the others wait for the same moment, and only one of them
        gets it; a longer jitter would leave the horizon unfilled)."""
        self._refusals += 1
        jitter = span * min(2 ** (self._refusals - 1), max(1, self.processes),
                            MAX_JITTER_BATCHES)
        self._ask_at = max(now, tat - self.horizon + span) + self.draw() * jitter

    def _failed(self, error: BaseException, now: float) -> NoReturn:
        self._unavailable = True
        self._ask_at = now + UNAVAILABLE_RETRY_SECONDS
        raise LimiterUnavailable(f"limits store unavailable ({self.key}): "
                                 f"{type(error).__name__}: {error}", self._ask_at) from error


class ConcurrencyLease:
    """One process's share of a channel's `max_concurrency`, held in `concurrency#<channel>`
    (each holder's entry `h#<holder>` = {n: its share, w: the handlers it wants, u: until when,
    epoch s}, and a `version`): a holder runs at most its share of handlers at once, and the
    shares of live holders add up to at most the limit.

    `acquire(want)`: one consistent GetItem, then one UpdateItem on the version read (a lost
    race reads again, once): its share is what the others' live entries leave, and at most an
    even split when another holder wants more than it has (shares converge within a renewal).
    Renewed every LEASE_SECONDS / 3; a crashed holder's entry expires after LEASE_SECONDS and
    is removed by the next writer. The store unavailable: the share holds until its `until`
    (the others count it until then), then it is 0 (no handler starts) until the store answers.

    store: the limits table. channel / holder: the item and this process's entry. clock: epoch
    seconds."""

    def __init__(self, store: LimitStore, channel: str, holder: str,
                 clock: Callable[[], float] | None = None) -> None:
        self.store = store
        self.key = f"concurrency#{channel}"
        self.holder = holder
        self.clock = clock or store.clock
        self.share = 0
        self.until = 0.0
        self.renewed_at = 0.0
        self.requests = 0

    def current(self) -> int:
        """The share this process may use now (0 once its lease ran out unrenewed)."""
        return self.share if self.clock() < self.until else 0

    def acquire(self, limit: int, want: int) -> int:
        """Take (or renew, resize) this process's share of `limit` for `want` handlers; the
        share. Raises LimiterUnavailable when the store fails (the share held stays until its
        end)."""
        now = self.clock()
        self.renewed_at = now
        for _ in range(2):
            try:
                self.requests += 1
                item = call_with_budget(functools.partial(
                    self.store.dynamodb.get_item, TableName=self.store.table,
                    Key={"key": {"S": self.key}}, ConsistentRead=True),
                    STORE_BUDGET_SECONDS, "reading the concurrency lease").get("Item") or {}
                others, expired = {}, []
                for name, value in item.items():
                    if not name.startswith("h#") or name == f"h#{self.holder}":
                        continue
                    entry = value.get("M", {})
                    until = float(entry.get("u", {}).get("N", "0"))
                    if until <= now:
                        expired.append(name)
                    else:
                        others[name] = (int(entry["n"]["N"]), int(entry["w"]["N"]))
                free = limit - sum(n for n, _ in others.values())
                share = max(0, min(want, free))
                if any(w > n for n, w in others.values()):  # others want more: an even split
                    share = min(share, max(1, limit // (len(others) + 1)))
                version = item.get("version", {}).get("N")
                names = {"#me": f"h#{self.holder}", "#v": "version", "#exp": EXPIRES_AT}
                values: dict[str, Any] = {
                    ":me": {"M": {"n": {"N": str(share)}, "w": {"N": str(want)},
                                  "u": {"N": repr(now + LEASE_SECONDS)}}},
                    ":next": {"N": str(int(version or 0) + 1)},
                    ":exp": {"N": str(int(now + ITEM_TTL_SECONDS))}}
                expression = "SET #me = :me, #v = :next, #exp = :exp"
                if expired:
                    for index, name in enumerate(expired):
                        names[f"#x{index}"] = name
                    expression += " REMOVE " + ", ".join(f"#x{i}" for i in range(len(expired)))
                if version is None:
                    condition = "attribute_not_exists(#v)"
                else:
                    condition = "#v = :version"
                    values[":version"] = {"N": version}
                self.requests += 1
                call_with_budget(functools.partial(
                    self.store.dynamodb.update_item, TableName=self.store.table,
                    Key={"key": {"S": self.key}}, UpdateExpression=expression,
                    ConditionExpression=condition, ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values),
                    STORE_BUDGET_SECONDS, "taking the concurrency lease")
            except ClientError as error:
                if error_code(error) == "ConditionalCheckFailedException":
                    continue  # another holder wrote meanwhile: read again
                raise LimiterUnavailable(f"concurrency lease unavailable ({self.key}): "
                                         f"{error}", now + UNAVAILABLE_RETRY_SECONDS) from error
            except (RetryBudgetExhausted, BotoCoreError) as error:
                raise LimiterUnavailable(f"concurrency lease unavailable ({self.key}): "
                                         f"{error}", now + UNAVAILABLE_RETRY_SECONDS) from error
            # A smaller share holds at once; the entry says so before a larger one is used.
            self.share, self.until = share, now + LEASE_SECONDS
            return share
        return self.current()  # raced twice: keep what is held, try again at the next renewal

    def release(self) -> None:
        """Give the share back (at shutdown): one UpdateItem; a failure only lets it expire."""
        self.share = 0
        try:
            call_with_budget(functools.partial(
                self.store.dynamodb.update_item, TableName=self.store.table,
                Key={"key": {"S": self.key}}, UpdateExpression="REMOVE #me",
                ExpressionAttributeNames={"#me": f"h#{self.holder}"}),
                STORE_BUDGET_SECONDS, "releasing the concurrency lease")
        except Exception:  # (it expires after LEASE_SECONDS)
            pass


__all__ = [
    "BATCH_SECONDS", "LEASE_SECONDS", "LIMIT_FIELDS", "METRIC_DIMENSION", "METRIC_LIMITED",
    "METRIC_NAMESPACE", "METRIC_STARTED", "METRIC_WAITING", "REFRESH_SECONDS", "UNLIMITED",
    "ChannelLimits", "ConcurrencyLease", "FlowReport", "LimitStore", "LimitsView",
    "LimiterUnavailable", "RateLimiter", "batch_size", "check_limit", "rate_key",
]
