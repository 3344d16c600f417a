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
from messenger.ops.prices import PRICES_CHECKED  # noqa: E402
from messenger.produce.producer import Producer, PushItem  # noqa: E402
from messenger.provision import Provisioner  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "200"))
CONCURRENCY = 10
#: A run that has not handled every job in this long is reported as stopped.
TIMEOUT_SECONDS = 300.0


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

    def count_from_now(self) -> None:
        self._wait(self.expected)
        self.meter = WireMeter().attach(self.clients)

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
        meter = self.meter
        assert meter is not None
        return {
            "jobs": JOBS,
            "requests_per_job": round(meter.total_requests / JOBS, 3),
            "dollars_per_million_jobs": round(meter.usage.total_dollars() / JOBS * 1e6, 2),
            "dynamodb_requests_per_job": round(sum(
                n for op, n in meter.requests.items() if op.startswith("dynamodb.")) / JOBS, 3),
            "requests_by_operation": dict(sorted(meter.requests.items())),
            "billed": {key: round(amount, 2) for key, amount in sorted(meter.usage.items())},
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
