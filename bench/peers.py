"""This consumer against the peer `aws-sqs-consumer` (PyPI) draining the same backlog.

Each drain pushes a backlog of 1,000 messages to a fresh queue, then drains it in a child
process with one consumer. A round runs the three drains below back to back, in ORDER or
reversed (alternating from round to round), and each CPU ratio is taken within a round
(messenger's drain over the peer's next to it), so a slow spell of the shared machine weighs on
both sides of a ratio. Every figure is the median over the rounds (12 by default: see ROUNDS),
with its spread: min, max, quartiles, IQR, MAD and the median's confidence interval (96% with
12 rounds).

The child measures its own CPU time (all threads) from the start of the drain until every
message is handled and deleted, and counts its AWS requests with botocore's `before-send`
event. For messenger the drain starts once it is LISTENING and ends once its deleter has had
every message deleted (counted from the DeleteMessageBatch responses) and every event of the
drain is in the log (the held lines written, as the shutdown would); its startup (provisioning
or verifying the channel) and its shutdown (health file to EXITING and EXITED, threads joined:
once per process, ~3-5 ms) are reported apart, `startup_cpu_seconds` and
`shutdown_cpu_seconds`, and `cpu_ratio_with_shutdown` counts the shutdown in. The peer has
neither: its clock runs from `start()` until it returns after the delete batch of the last
message. The benchmark's own readings (the threads' CPU, counting the log lines) are not
counted. `messages_per_second` is timed from the same start (messenger: LISTENING) to the last
message handled.

No drain leaks into the next one's window: each child is reaped before the next starts, and
each drains its own fresh queue, so a long poll a child left open when it exited (messenger's
receiver is not joined at shutdown) waits on an empty queue that nobody uses again. The local
endpoint records every request (moto's recorder) with the child's user agent app id, and
`isolation` checks it: every request of a child arrived before the next child's first, its
receives and deletes went to its own queue, and the endpoint got exactly the requests the
child counted.

- messenger: `Consumer` as deployed: concurrency 10, JSON event log on (to a file, as a
  container's stderr would be), health file on, plain botocore (messenger replaces none of its
  code since issue 40; docs/fast-botocore.md).
- peer: `aws_sqs_consumer.Consumer` with `batch_size=10` (its cheapest setting: one receive and
  one delete batch per 10 messages), one thread, its default of asking SQS for no attributes.
  The goal is judged against it.
- peer_attributes: the same, asking for what messenger reads of each message (all message
  attributes: id, routing key, meta headers; receive count, time sent, group): a peer that
  could tell these messages' routing keys and headers. Printed for context
  (`cpu_ratio_same_attributes`; this drain is not next to messenger's in the round).

Messenger's first round also reports its CPU seconds and context switches per thread role
(receiver, deleter, workers, lease keeper, watchdog; `other` holds the startup): where the CPU goes.

Goal: CPU ratio (messenger / peer), the median of the rounds, <= 1.0; messenger
requests/message <= 0.22. The peer is a benchmark-only dependency:
`pip install -r bench/requirements.txt`.

    python bench/peers.py [--rounds 12] [--messages 1000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.harness import backlog, json_log_to_file  # noqa: E402

CPU_RATIO_GOAL = 1.0
REQUESTS_GOAL = 0.22


# -- the children ---------------------------------------------------------------------------
def drain_messenger(queue: str, namespace: str, messages: int,
                    concurrency: int = 10) -> dict[str, Any]:
    import logging

    from messenger.aws import ClientFactory, RequestCounter
    from messenger.consume.consumer import Consumer, ConsumerSettings
    from messenger.settings import Settings

    log = json_log_to_file()
    settings = Settings.from_env(namespace=namespace)
    clients = ClientFactory(settings.region)
    counter = RequestCounter().attach(clients)
    handled = [0]
    lock = threading.Lock()
    done = threading.Event()
    deleted = [0]
    all_deleted = threading.Event()

    def count_deleted(parsed: Any = None, **_: Any) -> None:  # after-call of a delete batch
        with lock:
            deleted[0] += len((parsed or {}).get("Successful", []))
            if deleted[0] >= messages:
                all_deleted.set()

    clients.register("after-call.sqs.DeleteMessageBatch", count_deleted)

    listening: list[float] = []

    class Drain(Consumer):
        channel = queue

        def handler(self, message: Any) -> None:
            with lock:
                handled[0] += 1
                if handled[0] >= messages:
                    done.set()

        def on_event(self, event: Any) -> None:
            if event.name == "state" and event.fields["state"] == "LISTENING" and not listening:
                # startup (provisioning) done: CPU and wall clock from here
                listening.extend((time.process_time(), time.perf_counter()))
            super().on_event(event)

    health = os.path.join(tempfile.mkdtemp(), "health.json")
    consumer = Drain(settings=settings, clients=clients,
                     runtime=ConsumerSettings(concurrency=concurrency, health_file=health))
    cpu = time.process_time()
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    done.wait(600)
    drained = time.perf_counter()  # every message handled (the peer's clock stops there too)
    all_deleted.wait(60)  # every message deleted (so is the peer's when its clock stops)
    for handler in logging.getLogger().handlers:  # every event of the drain in the log, as
        handler.flush()  # the shutdown would write them (held lines, whatever their age)
    drain_cpu = time.process_time()
    threads = thread_costs()  # before shutdown: the runtime's threads are still there
    stopping = time.process_time()
    consumer.request_shutdown()
    thread.join(60)
    stopped = time.process_time()
    lines = sum(1 for _ in open(log.name))
    os.unlink(log.name)
    return {"cpu_seconds": drain_cpu - listening[0],
            "startup_cpu_seconds": listening[0] - cpu, "shutdown_cpu_seconds": stopped - stopping,
            "deleted": deleted[0], "wall_seconds": drained - listening[1],
            "handled": handled[0], "requests": counter.total, "log_lines": lines,
            "by_operation": dict(counter.counts), "threads": threads}


def thread_costs() -> dict[str, dict[str, float]]:
    """CPU seconds and context switches so far of this process's threads, by role (the
    runtime's threads are named messenger-<role>; its workers are summed). Linux only (empty
    elsewhere): where the drain's CPU goes."""
    costs: dict[str, dict[str, float]] = {}
    for thread in threading.enumerate():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident or 0))
            with open(f"/proc/self/task/{thread.native_id}/status") as status:
                # voluntary_ctxt_switches and nonvoluntary_ctxt_switches
                switches = sum(int(line.split()[1]) for line in status
                               if "ctxt_switches:" in line)
        except (AttributeError, OSError):
            return {}
        role = thread.name.removeprefix("messenger-").split("-")[0]
        if role not in ("worker", "receiver", "deleter", "leases", "watchdog"):
            role = "other"  # the consumer's own thread (startup included), the main thread
        found = costs.setdefault(role, {"cpu_seconds": 0.0, "context_switches": 0})
        found["cpu_seconds"] = round(found["cpu_seconds"] + seconds, 4)
        found["context_switches"] += switches
    return costs


def drain_peer(queue_url: str, messages: int, attributes: bool = False) -> dict[str, Any]:
    import boto3
    from aws_sqs_consumer import Consumer

    from messenger.aws import RequestCounter

    counter = RequestCounter()
    sqs = boto3.session.Session(region_name="us-east-1").client("sqs")
    sqs.meta.events.register("before-send", counter)
    handled = [0]

    class Drain(Consumer):
        def handle_message_batch(self, batch: list[Any]) -> None:
            handled[0] += len(batch)
            if handled[0] >= messages:
                self.stop()

    read: dict[str, Any] = {}
    if attributes:  # what messenger reads (mailbox.SYSTEM_ATTRIBUTES, every message attribute)
        from messenger.consume.mailbox import SYSTEM_ATTRIBUTES

        read = {"attribute_names": list(SYSTEM_ATTRIBUTES), "message_attribute_names": ["All"]}
    consumer = Drain(queue_url=queue_url, sqs_client=sqs, batch_size=10, wait_time_seconds=20,
                     region="us-east-1", **read)
    cpu, wall = time.process_time(), time.perf_counter()
    consumer.start()  # returns after the batch that reached `messages` (deleted)
    return {"cpu_seconds": time.process_time() - cpu, "startup_cpu_seconds": 0.0,
            "shutdown_cpu_seconds": 0.0,
            "wall_seconds": time.perf_counter() - wall,
            "handled": handled[0], "requests": counter.total, "log_lines": 0,
            "by_operation": dict(counter.counts)}


# -- the parent ------------------------------------------------------------------------------
#: Rounds by default. A round's ratio pairs two drains run back to back, so a slow spell of the
#: shared machine hits both; rounds still ranged 0.64-1.52 on a loaded machine. With 12 rounds
#: (an even count: as many rounds start with messenger as with the peer) the 3rd-lowest and
#: 3rd-highest round ratios bound a 96% confidence interval of the median (order statistics,
#: whatever the distribution), so two outlying rounds on either side cannot move it; 9 rounds
#: is the fewest for which such an interval leaves out the extremes at all.
ROUNDS = 12
#: Each round runs the three drains in this order, or reversed: messenger next to the peer,
#: either way (the ratios pair those).
ORDER = ("messenger", "peer", "peer_attributes")
#: Each round ratio: (numerator, denominator) drains of the same round.
RATIOS = {"cpu_ratio": ("messenger", "peer"),
          "cpu_ratio_same_attributes": ("messenger", "peer_attributes")}
#: The user agent's app id (AWS_SDK_UA_APP_ID) of each child: which process sent a request.
APP_ID = "peers-r{round}-{name}"



def run_child(args: list[str], app_id: str) -> dict[str, Any]:
    """Run one drain in a child process and reap it (subprocess.run waits for its exit)."""
    env = dict(os.environ)
    env["AWS_SDK_UA_APP_ID"] = app_id
    result = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                            timeout=900, env=env)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def spread(values: list[float]) -> dict[str, Any]:
    """Median of the rounds with its spread: min, max, quartiles, IQR, MAD (median absolute
    deviation) and the median's distribution-free confidence interval (order statistics)."""
    ordered = sorted(values)
    n = len(ordered)
    median = statistics.median(ordered)
    q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if n > 1 else [median] * 3
    # The widest k with P(Binomial(n, 1/2) < k) <= 2.5%: [x_k, x_(n+1-k)] holds the median
    # with probability 1 - 2 P(B < k) (>= 95%); none when even min..max is less sure.
    below = [math.comb(n, i) / 2 ** n for i in range(n + 1)]
    k = 0
    while k < n // 2 and sum(below[:k + 1]) <= 0.025:
        k += 1
    found: dict[str, Any] = {
        "median": round(median, 3), "min": round(ordered[0], 3), "max": round(ordered[-1], 3),
        "q1": round(q1, 3), "q3": round(q3, 3), "iqr": round(q3 - q1, 3),
        "mad": round(statistics.median(abs(v - median) for v in ordered), 3),
    }
    if k:
        found["median_ci"] = [round(ordered[k - 1], 3), round(ordered[n - k], 3)]
        found["median_ci_confidence"] = round(1 - 2 * sum(below[:k]), 3)
    found["rounds"] = [round(v, 3) for v in values]
    return found


def start_recording(endpoint: str | None) -> str | None:
    """Have the local endpoint record every request (moto's recorder, in arrival order) into
    the file MOTO_RECORDER_FILEPATH names; None (no check) against another endpoint."""
    if endpoint is None:
        return None
    import urllib.request

    request = urllib.request.Request(f"{endpoint}/moto-api/recorder/start-recording",
                                     method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10):
        pass
    return os.environ["MOTO_RECORDER_FILEPATH"]


def requests_by_process(recording: str) -> list[tuple[str, str, str]]:
    """(app id, SQS action, queue URL) of each recorded request, in arrival order; the parent's
    own requests (no app id) are left out."""
    import base64

    found = []
    with open(recording) as lines:
        for line in lines:
            entry = json.loads(line)
            agent = entry["headers"].get("User-Agent", "")
            app = next((p[4:] for p in agent.split() if p.startswith("app/peers-")), None)
            if app is None:
                continue
            body = entry.get("body") or ""
            if entry.get("body_encoded"):
                body = base64.b64decode(body).decode()
            target = entry["headers"].get("X-Amz-Target", "")
            queue = json.loads(body).get("QueueUrl", "") if body.startswith("{") else ""
            found.append((app, target.rpartition(".")[2], queue))
    return found


def check_isolation(recording: str, drains: list[tuple[str, str, dict[str, Any]]]
                    ) -> dict[str, Any]:
    """Prove from the endpoint's side that no drain leaked into another's window: every request
    of a child arrived before the next child's first (the children ran one after another, each
    reaped before the next started), its receives and deletes went to its own fresh queue only,
    and the endpoint got exactly the requests the child counted itself. A long poll still open
    when a child exited waits on that child's queue, which is empty and never used again.

    drains: (app id, queue URL, the child's result) in the order they ran."""
    seen = requests_by_process(recording)
    position = {app: n for n, (app, _, _) in enumerate(drains)}
    last = -1
    for app, action, queue in seen:
        n = position[app]
        if n < last:
            raise AssertionError(f"{app} sent {action} after {drains[last][0]} had started")
        last = n
        own = drains[n][1]
        if action in ("ReceiveMessage", "DeleteMessageBatch", "DeleteMessage",
                      "ChangeMessageVisibility", "ChangeMessageVisibilityBatch") \
                and queue != own:
            raise AssertionError(f"{app} sent {action} to {queue}, not its queue {own}")
    counted = {app: 0 for app, _, _ in drains}
    receives = dict(counted)
    for app, action, _ in seen:
        counted[app] += 1
        receives[app] += action == "ReceiveMessage"
    for app, _, result in drains:
        if counted[app] != result["requests"]:
            raise AssertionError(f"{app}: the endpoint got {counted[app]} requests, the child "
                                 f"sent {result['requests']}")
        if receives[app] != result["by_operation"].get("sqs.ReceiveMessage", 0):
            raise AssertionError(f"{app}: receives differ between the endpoint and the child")
    return {"checked": True, "drains": len(drains), "requests": len(seen),
            "receives": sum(receives.values())}


def measure(rounds: int, messages: int, endpoint: str | None = None) -> dict[str, Any]:
    namespace = f"p{uuid.uuid4().hex[:6]}"
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ORDER}
    drains: list[tuple[str, str, dict[str, Any]]] = []
    load = [os.getloadavg()[0]]
    recording = start_recording(endpoint)
    for round_number in range(rounds):
        order = ORDER if round_number % 2 == 0 else ORDER[::-1]
        for name in order:
            # A fresh queue per drain: nothing of an earlier child can reach this one's.
            channel = f"drain_{name}_{round_number}"
            url = backlog(namespace, channel, messages, pad=200)
            target = channel if name.startswith("messenger") else url
            app_id = APP_ID.format(round=round_number, name=name)
            result = run_child(["--drain", name, target, namespace, str(messages)], app_id)
            runs[name].append(result)
            drains.append((app_id, url, result))
        load.append(os.getloadavg()[0])
    summary: dict[str, Any] = {}
    for name, found in runs.items():
        assert all(r["handled"] >= messages for r in found), (name, found)
        assert all(r.get("deleted", messages) >= messages for r in found), (name, found)
        cpu = [r["cpu_seconds"] * 1000 / messages for r in found]
        summary[name] = {
            "cpu_seconds_per_1000": round(statistics.median(cpu), 4),
            "cpu_seconds_per_1000_rounds": [round(c, 4) for c in cpu],
            "startup_cpu_seconds": round(statistics.median(
                r["startup_cpu_seconds"] for r in found), 4),
            "shutdown_cpu_seconds": round(statistics.median(
                r["shutdown_cpu_seconds"] for r in found), 4),
            "requests_per_message": round(
                statistics.median(r["requests"] / messages for r in found), 4),
            "messages_per_second": round(
                statistics.median(messages / r["wall_seconds"] for r in found), 1),
            "log_lines_per_message": round(found[0]["log_lines"] / messages, 2),
            "threads_first_round": found[0].get("threads", {}),
            "by_operation": found[0]["by_operation"],
        }
    ratios = {key: spread([a["cpu_seconds"] / b["cpu_seconds"]
                           for a, b in zip(runs[top], runs[bottom], strict=True)])
              for key, (top, bottom) in RATIOS.items()}
    # messenger's drain plus stopping the consumer (once per process), against the peer
    with_shutdown = spread([(a["cpu_seconds"] + a["shutdown_cpu_seconds"]) / b["cpu_seconds"]
                            for a, b in zip(runs["messenger"], runs["peer"], strict=True)])
    requests = summary["messenger"]["requests_per_message"]
    return {
        "messages": messages, "rounds": rounds,
        "load_average": {"start": round(load[0], 2), "end": round(load[-1], 2),
                         "median": round(statistics.median(load), 2)},
        **summary, **ratios,
        "cpu_ratio_goal": CPU_RATIO_GOAL, "cpu_ratio_with_shutdown": with_shutdown,
        "requests_goal": REQUESTS_GOAL,
        "isolation": (check_isolation(recording, drains) if recording
                      else {"checked": False, "why": "not the local endpoint"}),
        "meets_goal": ratios["cpu_ratio"]["median"] <= CPU_RATIO_GOAL
        and requests <= REQUESTS_GOAL,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--drain", nargs=4, metavar=("WHO", "TARGET", "NAMESPACE", "N"))
    args = parser.parse_args()
    if args.drain:
        who, target, namespace, count = args.drain
        os.environ["MESSENGER_NAMESPACE"] = namespace
        result = (drain_messenger(target, namespace, int(count)) if who.startswith("messenger")
                  else drain_peer(target, int(count), attributes=who == "peer_attributes"))
        print(json.dumps(result))
        return
    from messenger.tools.local import endpoint_from_env

    recording = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False)
    os.environ["MOTO_RECORDER_FILEPATH"] = recording.name  # (the local endpoint inherits it)
    try:
        with endpoint_from_env() as endpoint:
            print(json.dumps(measure(args.rounds, args.messages, endpoint), indent=2))
    finally:
        os.unlink(recording.name)


if __name__ == "__main__":
    main()
