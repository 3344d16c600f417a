"""Results and workflows' cost: requests and dollars per job, producer and consumer together.

Five kinds of job, BENCH_JOBS each (default 200), every one pushed and consumed to its end:
- plain: a channel that neither tracks status nor keeps results (`push_many`, batches of 10);
- tracked: `track_status` only: the baseline a result adds to (keep_results needs tracking);
- result: `keep_results`: the handler's return value and final outcome kept (one UpdateItem);
- group member: `Producer.group(items, then=...)` of all of them, the callback included
  (its cost spread over the members);
- dependent: a job held until another finished (`push(depends_on=[one job])`), both on
  channels that keep results; the figure is the pair's cost less its dependency's (a result
  job's), so it is the dependent job's own: its hold, its release, and its own run.
Also the 15-minute sweep with nothing open (its cost per run, not per job).

Each kind gets channels of its own (provisioned, consumers listening and tables made before
counting starts); every request of the producer and the consumers is metered on the wire
(botocore's 'before-send' and 'after-call' events: `messenger.ops.cost.WireMeter`) and priced
with `messenger.ops.prices` (DynamoDB in write and read units by size, SQS per 64 KiB chunk;
KMS calls SQS makes itself, within its data-key reuse, are not client requests and are not
counted). The consumers' empty long polls at the end count too: a few per kind. Runs against a
child-process local endpoint or AWS_ENDPOINT_URL if set. Prints JSON.

DynamoDB bills an UpdateItem by the item's size (the larger of before and after, per 1 KB),
not by the request's: a group's item holds every member's id and outcome, and a held job's its
message. The meter prices by the request, so `ItemSizedWrites` also sizes each workflows-table
UpdateItem by the item it returns (ALL_NEW: the item after) and the kind reports
`item_sized_dollars_per_million_jobs`: the metered dollars plus those write units' excess.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import listening_consumer  # noqa: E402
from messenger.aws import ClientFactory  # noqa: E402
from messenger.channel import ChannelSpec  # noqa: E402
from messenger.consume.consumer import Consumer  # noqa: E402
from messenger.jobs.dedup import DedupTable  # noqa: E402
from messenger.jobs.results import ResultStore  # noqa: E402
from messenger.jobs.status import StatusStore  # noqa: E402
from messenger.jobs.workflows import Workflows  # noqa: E402
from messenger.ops.cost import WireMeter  # noqa: E402
from messenger.ops.prices import PRICES, PRICES_CHECKED  # noqa: E402
from messenger.produce.producer import Producer, PushItem  # noqa: E402
from messenger.provision import Provisioner  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "200"))
CONCURRENCY = 10
#: A run that has not handled every job in this long is reported as stopped.
TIMEOUT_SECONDS = 300.0


def item_bytes(value: dict[str, Any]) -> int:
    """A DynamoDB attribute value's size as DynamoDB counts it (approximately: numbers as
    their digits)."""
    (kind, content), = value.items()
    if kind in ("S", "B"):
        return len(content.encode()) if kind == "S" else len(content)
    if kind == "N":
        return (len(content.strip("-").replace(".", "").lstrip("0")) + 1) // 2 + 1
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "BS"):
        return sum(len(entry.encode()) for entry in content)
    if kind == "NS":
        return sum(item_bytes({"N": entry}) for entry in content)
    if kind == "L":
        return 3 + sum(1 + item_bytes(entry) for entry in content)
    return 3 + sum(1 + len(name.encode()) + item_bytes(entry) for name, entry in content.items())


class ItemSizedWrites:
    """botocore hooks: every UpdateItem on `table`, in write units of the item it returns
    (1 KB each), beside the units of its request (what the meter bills)."""

    def __init__(self, clients: ClientFactory, table: str) -> None:
        self.table, self.item_units, self.request_units, self.largest_item = table, 0, 0, 0
        self._lock = threading.Lock()
        clients.register("provide-client-params.dynamodb.UpdateItem", self._params)
        clients.register("after-call.dynamodb.UpdateItem", self._answer)

    def _params(self, params: Any = None, context: Any = None, **_: Any) -> None:
        if isinstance(context, dict) and isinstance(params, dict):
            context["bench_table"] = params.get("TableName")
            context["bench_request_bytes"] = len(json.dumps(params, default=str))

    def _answer(self, parsed: Any = None, context: Any = None, **_: Any) -> None:
        if not isinstance(context, dict) or context.get("bench_table") != self.table:
            return
        attributes = (parsed or {}).get("Attributes")
        if not attributes:
            return
        size = sum(len(name.encode()) + item_bytes(value) for name, value in attributes.items())
        with self._lock:
            self.item_units += max(1, -(-size // 1024))
            self.request_units += max(1, -(-context.get("bench_request_bytes", 0) // 1024))
            self.largest_item = max(self.largest_item, size)


class Handled(Consumer):
    """Returns {"n": ...} of each job (a result where the channel keeps them); counts them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled = 0
        self._lock = threading.Lock()

    def handler(self, message: Any) -> Any:
        with self._lock:
            self.handled += 1
        return {"n": message.body.get("n") if isinstance(message.body, dict) else None}

    def on_event(self, event: Any) -> None:
        pass


def _classes(name: str, track: bool, keep: bool) -> tuple[type[Producer], type[Handled]]:
    facts = {"channel": name, "track_status": track, "keep_results": keep}
    producer = type(f"P_{name}", (Producer,), {"channel": name, "track_status": track})
    return producer, type(f"C_{name}", (Handled,), facts)


class Kind:
    """One kind's channels, producers and listening consumers, on clients metered from the
    first push on."""

    def __init__(self, settings: Settings, label: str, channels: list[tuple[bool, bool]]
                 ) -> None:
        self.clients = ClientFactory(settings.region)
        self.names = [f"wf_{label}_{index}" for index in range(len(channels))]
        self.producers: list[Producer] = []
        self.consumers: list[tuple[Handled, threading.Thread]] = []
        provisioner = Provisioner(self.clients, settings)
        for name, (track, keep) in zip(self.names, channels, strict=True):
            provisioner.ensure_channel(ChannelSpec(name, namespace=settings.namespace,
                                                   track_status=track, keep_results=keep))
            producer_cls, consumer_cls = _classes(name, track, keep)
            producer = producer_cls(settings=settings, clients=self.clients)
            producer.push({"warm": True})  # its one-off checks and lookups, not counted
            self.producers.append(producer)
            self.consumers.append(listening_consumer(consumer_cls, settings, self.clients,
                                                     CONCURRENCY))
        self.expected = len(self.names)  # the warm-up jobs
        self.meter: WireMeter | None = None
        self.sized: ItemSizedWrites | None = None
        self.workflows_table = Workflows(self.clients, settings).table

    def count_from_now(self) -> None:
        self._wait(self.expected)
        self.meter = WireMeter().attach(self.clients)
        self.sized = ItemSizedWrites(self.clients, self.workflows_table)

    def finish(self, expected: int) -> dict[str, Any]:
        """Wait until the consumers handled `expected` more jobs, stop them (their deletes
        and status records flushed), and the metered figures per job."""
        started = time.monotonic()
        stopped = not self._wait(self.expected + expected)
        seconds = time.monotonic() - started
        for producer in self.producers:
            if producer.status is not None:
                producer.status.flush()
        for consumer, thread in self.consumers:
            consumer.request_shutdown()
            thread.join(60)
        meter, sized = self.meter, self.sized
        assert meter is not None and sized is not None
        excess = (sized.item_units - sized.request_units) * PRICES["dynamodb.write_unit"].dollars \
            / PRICES["dynamodb.write_unit"].per
        return {
            "jobs": JOBS,
            "requests_per_job": round(meter.total_requests / JOBS, 3),
            "dollars_per_million_jobs": round(meter.usage.total_dollars() / JOBS * 1e6, 2),
            "dynamodb_requests_per_job": round(sum(
                n for op, n in meter.requests.items() if op.startswith("dynamodb.")) / JOBS, 3),
            "requests_by_operation": dict(sorted(meter.requests.items())),
            "billed": {key: round(amount, 2) for key, amount in sorted(meter.usage.items())},
            "item_sized_dollars_per_million_jobs": round(
                (meter.usage.total_dollars() + excess) / JOBS * 1e6, 2),
            "workflows_update_write_units": {"by_request": sized.request_units,
                                             "by_item": sized.item_units,
                                             "largest_item_bytes": sized.largest_item},
            "drain_seconds": round(seconds, 2),
            "stopped": stopped,
        }

    def _wait(self, total: int) -> bool:
        deadline = time.monotonic() + TIMEOUT_SECONDS
        while sum(consumer.handled for consumer, _ in self.consumers) < total:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def plain(settings: Settings, track: bool, keep: bool, label: str) -> dict[str, Any]:
    kind = Kind(settings, label, [(track, keep)])
    kind.count_from_now()
    kind.producers[0].push_many({"n": n} for n in range(JOBS)).raise_for_failures()
    return kind.finish(JOBS)


def group_member(settings: Settings) -> dict[str, Any]:
    kind = Kind(settings, "group", [(True, True)])
    kind.count_from_now()
    group = kind.producers[0].group([{"n": n} for n in range(JOBS)], then=PushItem({"n": -1}))
    assert not group.failures, group.failures
    figures = kind.finish(JOBS + 1)  # the members and the callback
    figures["callback_included"] = True
    return figures


def dependent(settings: Settings, result_job: dict[str, Any]) -> dict[str, Any]:
    """The held jobs are pushed first (each names a dependency id not pushed yet: the usual
    order of a pipeline whose jobs wait for ones still running), then their dependencies."""
    kind = Kind(settings, "dependent", [(True, True), (True, True)])
    kind.count_from_now()
    deps = [f"dep-{uuid.uuid4().hex[:8]}-{n}" for n in range(JOBS)]
    for n, dep in enumerate(deps):
        kind.producers[1].push({"n": n}, depends_on=[dep])
    kind.producers[0].push_many(PushItem({"n": n}, message_id=dep)
                                for n, dep in enumerate(deps)).raise_for_failures()
    pair = kind.finish(2 * JOBS)
    return {
        "jobs": JOBS,
        "requests_per_job": round(pair["requests_per_job"] - result_job["requests_per_job"], 3),
        "dollars_per_million_jobs": round(pair["dollars_per_million_jobs"]
                                          - result_job["dollars_per_million_jobs"], 2),
        "item_sized_dollars_per_million_jobs": round(
            pair["item_sized_dollars_per_million_jobs"]
            - result_job["item_sized_dollars_per_million_jobs"], 2),
        "pair": pair,
        "note": "a dependent job's own cost: the pair's less its dependency's (a result job's)",
    }


def idle_sweep(settings: Settings) -> dict[str, Any]:
    clients = ClientFactory(settings.region)
    workflows = Workflows(clients, settings)
    workflows.ensure_table()
    meter = WireMeter().attach(clients)
    report = workflows.sweep()
    return {"requests": meter.total_requests, "looked": report.looked,
            "dollars_per_month_at_one_run_per_15_min": round(
                meter.usage.total_dollars() * 4 * 24 * 30, 6),
            "requests_by_operation": dict(sorted(meter.requests.items()))}


def main() -> dict[str, Any]:
    with endpoint_from_env():
        settings = Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}")
        clients = ClientFactory(settings.region)
        StatusStore(clients, settings).ensure_table()
        ResultStore(clients, settings).ensure_table()
        Workflows(clients, settings).ensure_table()
        DedupTable(clients, settings).ensure()  # released jobs' job-id claims
        kinds: dict[str, Any] = {
            "plain": plain(settings, False, False, "plain"),
            "tracked": plain(settings, True, False, "tracked"),
            "result": plain(settings, True, True, "result"),
        }
        kinds["group_member"] = group_member(settings)
        kinds["dependent"] = dependent(settings, kinds["result"])
        extra = {name: round(kinds[name]["requests_per_job"]
                             - kinds["tracked"]["requests_per_job"], 3)
                 for name in ("result", "group_member")}
        extra["dependent"] = round(kinds["dependent"]["requests_per_job"]
                                   - kinds["result"]["requests_per_job"], 3)
        return {
            "bench": "workflows",
            "jobs_per_kind": JOBS,
            "concurrency": CONCURRENCY,
            "prices_checked": PRICES_CHECKED.isoformat(),
            "kinds": kinds,
            "extra_requests_per_job": {
                **extra,
                "note": "result and group_member over tracked (keep_results needs "
                        "track_status); dependent over result"},
            "sweep_nothing_open": idle_sweep(settings),
        }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
