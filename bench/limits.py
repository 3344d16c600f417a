"""Flow control at its limits: 4 consumer processes, 50 tenants, a channel limit of 50/s and a
tenant limit of 2/s (`messenger.jobs.limits`, `messenger.consume.limits`).

Two phases, each on a fresh channel, with the Fargate runtime (`Consumer.run`) in 4 child
processes of 40 workers (handlers of 20 ms):

- channel: a backlog of every tenant (50 × 80 jobs): the tenants' limits allow 100/s, so the
  channel's 50/s binds. Measured over 60 s after a 5-s warm-up: the rate (goal: within 5 % of
  50/s), the busiest 1-s window of starts (goal: at most the limit plus one batch), DynamoDB
  requests per job (goal: at most 0.1 for the channel's limiter; the tenants' limiters are
  counted apart: they cost about 1 / their batch, 0.5 at 2/s).
- tenant: one tenant with a backlog (400 jobs) beside 49 tenants sending 0.5 jobs/s each (24.5
  jobs/s: the channel's limit does not bind). Measured over 60 s: the busy tenant's rate (goal:
  within 5 % of 2/s), and the light tenants' rate (what they send) and wait, from push to start
  (goal: at full speed beside it: no more than a second more than with no busy tenant: their
  jobs never wait for its units).

Requests are counted with botocore's 'before-send' event on each consumer's own clients
(`RequestCounter`), DynamoDB's by the item named (the channel's limiter, tenants' limiters, the
limits record, reports); held jobs (back in their queue with a delay) from the consumers'
'held' events. Runs against a child-process moto server (or AWS_ENDPOINT_URL if set); the 4
consumers and the moto server share the machine's cores. Prints JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger import Consumer, ConsumerSettings, Producer, ReceivedMessage  # noqa: E402
from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.channel import limits_table_name, parse_rate  # noqa: E402
from messenger.consume.lifecycle import LifecycleEvent  # noqa: E402
from messenger.jobs.limits import batch_size  # noqa: E402
from messenger.produce.push import PushItem  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

PROCESSES = 4
WORKERS = 40
TENANTS = 50
CHANNEL_LIMIT = "50/s"
TENANT_LIMIT = "2/s"
SECONDS = float(os.environ.get("BENCH_SECONDS", "60"))
WARM_UP = 5.0
HANDLER_SECONDS = 0.02


class LimitsTable:
    """botocore `before-send` hook on DynamoDB: requests on the limits table, by the kind of
    item they name (rate#C: 'channel', rate#C#tenant#T: 'tenant', limits#C, report#C, ...)."""

    def __init__(self, table: str) -> None:
        self.table = table
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, request: Any, event_name: str = "", **_: Any) -> None:
        body = request.body if isinstance(request.body, bytes) else str(request.body).encode()
        payload = json.loads(body or b"{}")
        if payload.get("TableName") != self.table:
            return
        key = str(payload.get("Key", {}).get("key", {}).get("S", ""))
        kind = "tenant" if "#tenant#" in key else key.split("#", 1)[0] or "table"
        if kind == "rate":
            kind = "channel"
        name = f"{kind}.{event_name.split('.')[2]}"
        with self._lock:
            self.counts[name] = self.counts.get(name, 0) + 1


class BenchJobs(Consumer):
    """Records when each job started, its tenant and when it was pushed; takes 20 ms."""

    rate_limit = CHANNEL_LIMIT
    tenant_rate_limit = TENANT_LIMIT
    max_receives = 5
    visibility_timeout = 30

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.starts: list[tuple[float, str | None, float]] = []
        self.held = 0
        self.delays: list[int] = []

    def handler(self, message: ReceivedMessage) -> None:
        self.starts.append((time.time(), message.group_id, float(message.body["at"])))
        time.sleep(HANDLER_SECONDS)

    def on_event(self, event: LifecycleEvent) -> None:
        if event.name == "held":
            self.held += 1
            self.delays.append(int(event.fields.get("delay", 0)))
        if event.name in ("failed", "dead_lettered", "fatal"):
            super().on_event(event)


def child(namespace: str, channel: str, out: str, stop_file: str) -> None:
    """One consumer process until `stop_file` exists; its starts and requests into `out`."""
    settings = Settings.from_env(namespace=namespace)
    clients = ClientFactory(settings.region)
    counter = RequestCounter().attach(clients)
    table = LimitsTable(limits_table_name(namespace))
    clients.register("before-send.dynamodb", table)
    cls = type("BenchJobs", (BenchJobs,), {"channel": channel})
    consumer = cls(settings=settings, clients=clients, runtime=ConsumerSettings(
        concurrency=WORKERS, health_file=f"{out}.health", shutdown_timeout=10))
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    while consumer.limits is None or consumer.state is None or \
            consumer.state.value not in ("LISTENING", "IDLE", "PROCESSING"):
        time.sleep(0.1)
    open(f"{out}.ready", "w").close()
    while not os.path.exists(stop_file):
        time.sleep(0.2)
    consumer.request_shutdown()
    thread.join(60)
    with open(out, "w") as file:
        json.dump({"starts": consumer.starts, "held": consumer.held, "delays": consumer.delays,
                   "requests": dict(counter.counts), "limits_table": table.counts}, file)


def run_consumers(namespace: str, channel: str, seconds: float,
                  feed: Any = None) -> list[dict[str, Any]]:
    """PROCESSES consumers for `seconds` (while `feed(elapsed)` pushes, when given)."""
    folder = tempfile.mkdtemp(prefix="bench-limits-")
    stop_file = os.path.join(folder, "stop")
    outs = [os.path.join(folder, f"child-{n}.json") for n in range(PROCESSES)]
    children = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "child",
                                  namespace, channel, out, stop_file]) for out in outs]
    ready = time.monotonic() + 300
    while not all(os.path.exists(f"{out}.ready") for out in outs):  # (started up: loaded)
        if time.monotonic() > ready:
            raise RuntimeError("the consumers did not start within 300 s")
        time.sleep(0.1)
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < seconds:
        if feed is not None:
            feed(elapsed)
        time.sleep(0.25)
    open(stop_file, "w").close()
    for process in children:
        process.wait(120)
    results = []
    for out in outs:
        with open(out) as file:
            results.append(json.load(file))
    return results


def push(producer: Producer, items: list[PushItem]) -> None:
    for first in range(0, len(items), 10):
        producer.push_many(items[first:first + 10]).raise_for_failures()


def busiest_window(times: list[float], width: float = 1.0) -> int:
    """The most starts in any `width`-second window (each window starting at a start)."""
    times = sorted(times)
    most, end = 0, 0
    for begin, at in enumerate(times):
        while end < len(times) and times[end] < at + width:
            end += 1
        most = max(most, end - begin)
    return most


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    starts = [tuple(s) for result in results for s in result["starts"]]
    dynamodb: dict[str, int] = {}
    for result in results:
        for name, count in result["limits_table"].items():
            dynamodb[name] = dynamodb.get(name, 0) + count
    sqs = sum(count for result in results for op, count in result["requests"].items()
              if op.startswith("sqs."))
    jobs = len(starts)
    channel = sum(n for name, n in dynamodb.items() if name.startswith("channel."))
    tenant = sum(n for name, n in dynamodb.items() if name.startswith("tenant."))
    other = sum(dynamodb.values()) - channel - tenant
    delays = sorted(d for result in results for d in result["delays"])
    return {
        "jobs_started": jobs,
        "held_back": sum(result["held"] for result in results),
        "hold_delay_seconds": {"p50": delays[len(delays) // 2], "max": delays[-1]}
        if delays else {},
        "limits_table_requests": dict(sorted(dynamodb.items())),
        "dynamodb_requests_per_job": {
            "channel_limiter": round(channel / max(jobs, 1), 4),
            "tenant_limiters": round(tenant / max(jobs, 1), 4),
            "other": round(other / max(jobs, 1), 4),
            "total": round(sum(dynamodb.values()) / max(jobs, 1), 4)},
        "sqs_requests_per_job": round(sqs / max(jobs, 1), 3),
        "_starts": starts,
    }


def phase_channel(settings: Settings) -> dict[str, Any]:
    channel = f"bench_limits_ch_{uuid.uuid4().hex[:4]}"
    producer = type("P", (Producer,), {"channel": channel})(settings=settings)
    per_tenant = int((SECONDS + WARM_UP + 10) * 50 / TENANTS) + 1
    push(producer, [PushItem({"n": n, "at": time.time()}, group_id=f"t{n % TENANTS}")
                    for n in range(per_tenant * TENANTS)])
    result = summary(run_consumers(settings.namespace, channel, SECONDS + WARM_UP + 3))
    starts = sorted(at for at, _, _ in result.pop("_starts"))
    window = [at for at in starts if starts[0] + WARM_UP <= at < starts[0] + WARM_UP + SECONDS]
    rate = len(window) / SECONDS
    batch = batch_size(parse_rate(CHANNEL_LIMIT))
    busiest = busiest_window(window)
    result.update({
        "limit_per_second": parse_rate(CHANNEL_LIMIT).per_second, "batch": batch,
        "rate_per_second": round(rate, 2),
        "rate_off_limit_percent": round(100 * (rate - 50) / 50, 2),
        "busiest_1s_window": busiest,
        "ok": abs(rate - 50) <= 2.5 and busiest <= 50 + batch and
        result["dynamodb_requests_per_job"]["channel_limiter"] <= 0.1,
    })
    return result


def phase_tenant(settings: Settings, busy_backlog: int = 400) -> dict[str, Any]:
    channel = f"bench_limits_tn_{uuid.uuid4().hex[:4]}"
    producer = type("P", (Producer,), {"channel": channel})(settings=settings)
    push(producer, [PushItem({"n": n, "at": time.time()}, group_id="busy")
                    for n in range(busy_backlog)])
    light = [f"t{n}" for n in range(1, TENANTS)]
    sent = {"count": 0}

    def feed(elapsed: float) -> None:  # 0.5 jobs/s per light tenant, in push order
        due = int(elapsed * 0.5 * len(light))
        items = [PushItem({"n": n, "at": time.time()}, group_id=light[n % len(light)])
                 for n in range(sent["count"], due)]
        if items:
            push(producer, items)
            sent["count"] = due

    result = summary(run_consumers(settings.namespace, channel, SECONDS + WARM_UP + 3, feed))
    starts = result.pop("_starts")
    first = min(at for at, _, _ in starts)
    begin, end = first + WARM_UP, first + WARM_UP + SECONDS
    busy = [at for at, tenant, _ in starts if tenant == "busy" and begin <= at < end]
    lights = [(at, pushed) for at, tenant, pushed in starts
              if tenant != "busy" and begin <= at < end]
    waits = sorted(at - pushed for at, pushed in lights)
    rate = len(busy) / SECONDS

    def pct(q: float) -> float:
        return round(waits[min(len(waits) - 1, int(q * len(waits)))], 3) if waits else 0.0

    result.update({
        "tenant_limit_per_second": parse_rate(TENANT_LIMIT).per_second,
        "busy_tenant_rate_per_second": round(rate, 3),
        "busy_tenant_off_limit_percent": round(100 * (rate - 2) / 2, 2),
        "busiest_1s_window_busy_tenant": busiest_window(busy),
        "light_tenants_offered_per_second": round(0.5 * len(light), 2),
        "light_tenants_rate_per_second": round(len(lights) / SECONDS, 2),
        "light_tenant_wait_seconds": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99),
                                      "max": round(waits[-1], 3) if waits else 0.0},
    })
    return result


def main() -> None:
    from bench.harness import machine_busy

    before, load_before = machine_busy(), os.getloadavg()
    with endpoint_from_env():
        settings = Settings.from_env(namespace=f"bench{uuid.uuid4().hex[:6]}")
        report = {
            "bench": "limits", "processes": PROCESSES, "workers_per_process": WORKERS,
            "tenants": TENANTS, "channel_limit": CHANNEL_LIMIT, "tenant_limit": TENANT_LIMIT,
            "seconds": SECONDS, "handler_seconds": HANDLER_SECONDS,
        }
        phases = os.environ.get("BENCH_PHASES", "channel,tenant").split(",")
        if "channel" in phases:
            report["channel"] = phase_channel(settings)
        if "tenant" in phases:
            # The light tenants alone first: their wait with no busy tenant beside them.
            alone = phase_tenant(settings, busy_backlog=0)
            report["tenant_baseline"] = {
                key: alone[key] for key in ("jobs_started", "light_tenants_offered_per_second",
                                            "light_tenants_rate_per_second",
                                            "light_tenant_wait_seconds")}
            tenant = report["tenant"] = phase_tenant(settings)
            tenant["ok"] = abs(tenant["busy_tenant_rate_per_second"] - 2) <= 0.1 and \
                tenant["light_tenant_wait_seconds"]["p90"] <= \
                alone["light_tenant_wait_seconds"]["p90"] + 1.0
    after = machine_busy()
    if before is not None and after is not None:  # the machine's other work meanwhile
        report["machine_busy_percent"] = round(
            100 * (after[0] - before[0]) / max(1, after[1] - before[1]), 1)
    report["load_average_at_start"] = round(load_before[0], 1)
    report["cpus"] = os.cpu_count()
    report["ok"] = all(report[name]["ok"] for name in ("channel", "tenant") if name in report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child(*sys.argv[2:6])
    else:
        main()
