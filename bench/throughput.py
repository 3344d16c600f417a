"""Throughput of I/O-bound handlers against the limit and a peer, alternating rounds.

For each handler time (10, 50 and 200 ms: `time.sleep`, as a handler waiting on a network call)
and each round, a fresh queue gets a backlog of 500 messages; then one consumer in a child
process drains it with concurrency 10. The limit is concurrency / handler time (1,000, 200 and
50 msg/s): what 10 workers could do if a message were always there when a worker frees up.
Each run is timed from the moment its consumer is ready (messenger: LISTENING, after its
startup; the peer: its loop starts) to the end of the last handler, as if the 500 messages were
pushed at that moment: msg/s = 500 / that time, and the push-to-start latency of a message is
when its handler started, from the same moment (p50 and p99).

- messenger: `Consumer` as deployed (concurrency 10, JSON event log to a file, health file),
  with its bounded prefetch (`MESSENGER_PREFETCH_WAIT_SECONDS`, default 0.5 s). It also reports
  how long its messages waited in memory for a worker (from the poll's answer to the start of
  their handler: p99 and max) and how many it released for waiting past the bound.
  While it prefetches on a backlog it has up to `MAX_RECEIVES_IN_FLIGHT` (3) receives in
  flight at once.
- messenger_one_receive: the same with one receive in flight at a time
  (`MAX_RECEIVES_IN_FLIGHT` set to 1 in its process: the rule before several were allowed).
- messenger_free_workers_only: the same with `prefetch_wait=0`, which fetches only for free
  workers (the rule before the prefetch).
- boto3_pool: the peer, a 20-line boto3 loop with a thread pool, written here as one would:
  receive up to 10 messages for the free slots of the pool (long poll), submit each to the pool,
  which runs the handler and deletes the message.
- one_receiver: what one receiving thread can bring at all, 10 messages per receive round trip
  (the mean time of messenger_one_receive's receives that came back full, against this
  endpoint: one moto server sharing the 2 cores with the consumer and whatever else runs), as
  msg/s and as a share of the limit, and messenger's msg/s as a share of the lower of that
  bound and the limit. With 10 ms handlers the limit (1,000 msg/s: 100 full receives and 100
  delete batches a second) is above what this endpoint answers here.
- Every consumer's CPU time while it drains (per message, and as a share of one core) and,
  for the local endpoint this script starts, the endpoint's CPU time (/proc) per request of
  the consumer and as a share of one core: the endpoint is one Python process.

Rounds alternate the order of the consumers; the figures are medians over the rounds. Requests
are counted with botocore's `before-send` event. Goal: messenger >= 0.85 of the limit at every
handler time.

Each figure is taken twice: on bare loopback (the top-level `handler_*` entries) and with a
fixed network round trip added to every request of the consumer child (`rtt_<ms>ms`: a
botocore `before-send` hook that sleeps that long, on messenger's clients and on the peer's
alike), as against SQS from inside a region (~10-30 ms a receive). On loopback the endpoint's
own time per request, on the 2 cores the consumer shares with it, is the round trip.

    python bench/throughput.py [--rounds 3] [--messages 500] [--handlers 0.01 0.05 0.2]
                               [--rtt-ms 0 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.harness import backlog, json_log_to_file  # noqa: E402

GOAL = 0.85
CONCURRENCY = 10
CONSUMERS = ("messenger", "messenger_one_receive", "messenger_free_workers_only", "boto3_pool")


# -- the children ---------------------------------------------------------------------------
class Timeline:
    """When each handler started and ended, from the moment the consumer is ready."""

    def __init__(self, messages: int) -> None:
        self.messages = messages
        self.ready: float | None = None
        self.cpu_at_ready = 0.0  # this process's CPU time then
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.gaps: list[float] = []  # a worker's wait between two of its handlers
        self._last_end: dict[int, float] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()

    def handle(self, seconds: float) -> None:
        began = time.monotonic()
        if seconds:
            time.sleep(seconds)
        ended = time.monotonic()
        with self.lock:
            self.starts.append(began)
            self.ends.append(ended)
            previous = self._last_end.get(threading.get_ident())
            if previous is not None:
                self.gaps.append(began - previous)
            self._last_end[threading.get_ident()] = ended
            if len(self.ends) >= self.messages:
                self.done.set()

    def start(self) -> None:
        self.ready = time.monotonic()
        self.cpu_at_ready = time.process_time()

    def summary(self) -> dict[str, Any]:
        assert self.ready is not None
        wall = max(self.ends) - self.ready
        cpu = time.process_time() - self.cpu_at_ready
        latency = sorted(start - self.ready for start in self.starts)
        return {"handled": len(self.ends), "wall_seconds": wall,
                "messages_per_second": len(self.ends) / wall,
                "latency_p50": percentile(latency, 0.5), "latency_p99": percentile(latency, 0.99),
                "worker_gap_p50": percentile(self.gaps, 0.5),
                "worker_gap_p90": percentile(self.gaps, 0.9),
                # the consumer's CPU (all its threads) while it drained, and its share of a core
                "cpu_seconds": cpu, "cpu_share": cpu / wall}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def add_round_trip(events: Any, seconds: float) -> None:
    """Every request of these clients takes `seconds` longer, as over a network (a
    `before-send` hook: `events` is a client's `meta.events` or a `ClientFactory`)."""
    if seconds > 0:
        events.register("before-send", lambda **_: time.sleep(seconds))


def drain_messenger(channel_name: str, messages: int, handler_seconds: float,
                    prefetch_wait: float | None, rtt_seconds: float = 0.0) -> dict[str, Any]:

    from messenger.aws import ClientFactory, RequestCounter
    from messenger.consume.consumer import Consumer, ConsumerSettings
    from messenger.settings import Settings

    log = json_log_to_file()
    settings = Settings.from_env()
    clients = ClientFactory(settings.region)
    timeline = Timeline(messages)
    received: dict[str, float] = {}
    waited: list[float] = []
    released: list[str] = []

    class Drain(Consumer):
        channel = channel_name

        def handler(self, message: Any) -> None:
            timeline.handle(handler_seconds)

        def on_event(self, event: Any) -> None:
            now = time.monotonic()
            if event.name == "state" and event.fields["state"] == "LISTENING" \
                    and timeline.ready is None:
                timeline.start()
            elif event.name == "received":
                received[event.message_id] = now
            elif event.name == "started" and event.message_id in received:
                waited.append(now - received.pop(event.message_id))
            elif event.name == "released":
                released.append(event.fields["reason"])
            super().on_event(event)

    health = os.path.join(tempfile.mkdtemp(), "health.json")
    runtime = ConsumerSettings.from_env(concurrency=CONCURRENCY, health_file=health)
    if prefetch_wait is not None:
        runtime = replace(runtime, prefetch_wait=prefetch_wait)
    consumer = Drain(settings=settings, clients=clients, runtime=runtime)
    counter = RequestCounter().attach(clients)
    round_trips = time_full_receives(clients)
    add_round_trip(clients, rtt_seconds)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    timeline.done.wait(600)
    consumer.request_shutdown()
    thread.join(60)
    os.unlink(log.name)
    return {**timeline.summary(), "requests": counter.total,
            "waited_in_memory_p99": percentile(waited, 0.99),
            "waited_in_memory_max": max(waited, default=0.0),
            "receive_round_trip": statistics.mean(round_trips) if round_trips else None,
            "released": len(released),
            "released_waiting_too_long": released.count("prefetch_expired")}


def time_full_receives(clients: Any) -> list[float]:
    """Seconds of each receive of the consumer's clients that came back with 10 messages (a
    full poll answers without waiting for messages: the endpoint's round trip; the mean over a
    run is what bounds one receiver's rate)."""
    began = threading.local()
    found: list[float] = []

    def before(**_: Any) -> None:
        began.at = time.monotonic()

    def after(parsed: Any = None, **_: Any) -> None:
        if len((parsed or {}).get("Messages", [])) == 10:
            found.append(time.monotonic() - began.at)

    clients.register("before-send.sqs.ReceiveMessage", before)
    clients.register("after-call.sqs.ReceiveMessage", after)
    return found


def drain_boto3_pool(queue_url: str, messages: int, handler_seconds: float,
                     rtt_seconds: float = 0.0) -> dict[str, Any]:
    """The peer: a plain boto3 loop feeding a thread pool, one slot per worker."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    from messenger.aws import RequestCounter

    counter = RequestCounter()
    sqs = boto3.session.Session(region_name="us-east-1").client("sqs")
    sqs.meta.events.register("before-send", counter)
    add_round_trip(sqs.meta.events, rtt_seconds)
    timeline = Timeline(messages)
    slots = threading.Semaphore(CONCURRENCY)

    def work(message: dict[str, Any]) -> None:
        try:
            timeline.handle(handler_seconds)
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        finally:
            slots.release()

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        timeline.start()
        while not timeline.done.is_set():
            slots.acquire()
            free = 1
            while free < 10 and slots.acquire(blocking=False):
                free += 1
            got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=free,
                                      WaitTimeSeconds=1).get("Messages", [])
            for message in got:
                pool.submit(work, message)
            for _ in range(free - len(got)):
                slots.release()
    return {**timeline.summary(), "requests": counter.total}


# -- the parent ------------------------------------------------------------------------------

def left_in(url: str) -> int:
    from messenger.aws import ClientFactory

    attributes = ClientFactory("us-east-1").client("sqs").get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                      "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return sum(int(value) for value in attributes.values())


def run_child(args: list[str], namespace: str) -> dict[str, Any]:
    env = {**os.environ, "MESSENGER_NAMESPACE": namespace}
    result = subprocess.run([sys.executable, __file__, "--drain", *args], capture_output=True,
                            text=True, timeout=900, env=env)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def endpoint_pid() -> int | None:
    """The local endpoint this script started (its child `python -m messenger local`), whose
    CPU time /proc tells; None when AWS_ENDPOINT_URL named another endpoint."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat, open(f"/proc/{entry}/cmdline", "rb") as cmd:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                command = cmd.read()
        except OSError:
            continue
        if parent == os.getpid() and b"messenger\0local" in command:
            return int(entry)
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(name: str, handler_seconds: float, messages: int, namespace: str,
            label: str, rtt_seconds: float, endpoint: int | None) -> dict[str, Any]:
    """One drain of a fresh queue: a consumer that exits leaves its last long poll waiting in
    the endpoint, which would take (and hide for a lease) messages of the next run's. With
    the endpoint's pid, also the endpoint's CPU time over the child's run (its startup's few
    requests included) per request of the consumer, and as a share of one core over the
    drain: the local endpoint is one Python process (one core at most, its GIL)."""
    channel = f"tp_{label}"
    url = backlog(namespace, channel, messages)
    target = url if name == "boto3_pool" else channel
    before = cpu_seconds(endpoint) if endpoint else 0.0
    found = run_child([name, target, str(messages), str(handler_seconds), str(rtt_seconds)],
                      namespace)
    if endpoint:
        cpu = cpu_seconds(endpoint) - before
        found["endpoint_cpu_per_request"] = cpu / found["requests"]
        found["endpoint_cpu_share"] = cpu / found["wall_seconds"]
    found["left_in_queue"] = left_in(url)
    return found


def median_of(runs: list[dict[str, Any]], key: str, digits: int = 3) -> float:
    return round(statistics.median(r[key] for r in runs), digits)


def measure(rounds: int, messages: int, handler_times: list[float],
            rtt_seconds: float = 0.0) -> dict[str, Any]:
    """The figures of every handler time, at one added round trip."""
    namespace = f"t{uuid.uuid4().hex[:6]}"
    rtt_label = f"_rtt{round(rtt_seconds * 1000)}" if rtt_seconds else ""
    endpoint = endpoint_pid()
    figures: dict[str, Any] = {}
    for handler_seconds in handler_times:
        limit = CONCURRENCY / handler_seconds
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONSUMERS}
        key = f"handler_{round(handler_seconds * 1000)}ms"
        for round_number in range(rounds):
            order = CONSUMERS if round_number % 2 == 0 else CONSUMERS[::-1]
            for name in order:
                # a queue per run (see one_run)
                label = f"{name}_{key}{rtt_label}_{round_number}"
                runs[name].append(one_run(name, handler_seconds, messages, namespace, label,
                                          rtt_seconds, endpoint))
        entry: dict[str, Any] = {"limit_messages_per_second": limit}
        for name, found in runs.items():
            assert all(r["handled"] >= messages and r["left_in_queue"] == 0 for r in found), \
                (name, found)
            rate = median_of(found, "messages_per_second", 1)
            entry[name] = {
                "messages_per_second": rate,
                "fraction_of_limit": round(rate / limit, 3),
                "latency_p50": median_of(found, "latency_p50"),
                "latency_p99": median_of(found, "latency_p99"),
                "requests_per_message": round(statistics.median(
                    r["requests"] / messages for r in found), 3),
                "rounds_messages_per_second": [round(r["messages_per_second"], 1)
                                               for r in found],
                "consumer_cpu_per_message_ms": round(statistics.median(
                    1000 * r["cpu_seconds"] / messages for r in found), 3),
                "consumer_cpu_share": median_of(found, "cpu_share"),
            }
            if endpoint:
                entry[name].update({
                    "endpoint_cpu_per_request_ms": round(statistics.median(
                        1000 * r["endpoint_cpu_per_request"] for r in found), 3),
                    "endpoint_cpu_share": median_of(found, "endpoint_cpu_share"),
                })
            if name.startswith("messenger"):
                entry[name].update({
                    "waited_in_memory_p99": median_of(found, "waited_in_memory_p99"),
                    "waited_in_memory_max": round(max(r["waited_in_memory_max"] for r in found),
                                                  3),
                    "released_waiting_too_long": sum(r["released_waiting_too_long"]
                                                     for r in found),
                })
        entry["ratio_to_one_receive"] = round(
            entry["messenger"]["messages_per_second"]
            / entry["messenger_one_receive"]["messages_per_second"], 3)
        entry["ratio_to_peer"] = round(entry["messenger"]["messages_per_second"]
                                       / entry["boto3_pool"]["messages_per_second"], 3)
        entry["summary"] = "; ".join(
            f"{name} {entry[name]['messages_per_second']:g} msg/s, p50 "
            f"{entry[name]['latency_p50']:g} s, p99 {entry[name]['latency_p99']:g} s"
            for name in ("messenger", "boto3_pool")) + f" (limit {limit:g} msg/s)"
        # One receiver brings at most 10 messages per round trip of the endpoint
        round_trip = statistics.median(r["receive_round_trip"]
                                       for r in runs["messenger_one_receive"]
                                       if r["receive_round_trip"] is not None)
        bound = 10 / round_trip
        entry["one_receiver"] = {
            "receive_round_trip": round(round_trip, 4),
            "bound_messages_per_second": round(bound, 1),
            "bound_fraction_of_limit": round(min(1.0, bound / limit), 3),
            "messenger_fraction_of_bound": round(
                entry["messenger"]["messages_per_second"] / min(bound, limit), 3),
        }
        figures[key] = entry
    fractions = [figures[k]["messenger"]["fraction_of_limit"] for k in figures]
    return {"added_round_trip": rtt_seconds, **figures,
            "lowest_fraction_of_limit": min(fractions), "meets_goal": min(fractions) >= GOAL,
            "load_average": os.getloadavg()}


def measure_all(rounds: int, messages: int, handler_times: list[float],
                rtts_ms: list[float]) -> dict[str, Any]:
    """The figures on bare loopback (top level) and at each added round trip (`rtt_<ms>ms`)."""
    found: dict[str, Any] = {"messages": messages, "concurrency": CONCURRENCY,
                             "rounds": rounds, "goal_fraction_of_limit": GOAL}
    for rtt_ms in rtts_ms:
        figures = measure(rounds, messages, handler_times, rtt_ms / 1000)
        if rtt_ms:
            found[f"rtt_{rtt_ms:g}ms"] = figures
        else:
            found.update(figures)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--handlers", type=float, nargs="+", default=[0.01, 0.05, 0.2])
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0, 20],
                        help="round trips added to every request of the consumer (0: bare "
                             "loopback); the figures are taken at each")
    parser.add_argument("--drain", nargs=5,
                        metavar=("WHO", "TARGET", "N", "HANDLER_SECONDS", "RTT_SECONDS"))
    args = parser.parse_args()
    if args.drain:
        who, target, count, seconds, rtt = args.drain
        if who == "boto3_pool":
            result = drain_boto3_pool(target, int(count), float(seconds), float(rtt))
        else:
            if who == "messenger_one_receive":
                from messenger.consume import prefetch

                prefetch.MAX_RECEIVES_IN_FLIGHT = 1
            result = drain_messenger(target, int(count), float(seconds),
                                     0.0 if who == "messenger_free_workers_only" else None,
                                     float(rtt))
        print(json.dumps(result))
        return
    from messenger.tools.local import endpoint_from_env

    with endpoint_from_env():
        print(json.dumps(measure_all(args.rounds, args.messages, args.handlers, args.rtt_ms),
                         indent=2))


if __name__ == "__main__":
    main()
