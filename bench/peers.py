"""This consumer against the peer `aws-sqs-consumer` (PyPI) draining the same backlog.

Each round pushes a backlog of 1,000 messages to a fresh queue, then drains it in a child
process with one consumer, alternating which consumer goes first from round to round (times on
a shared machine vary between runs, not much within one). The child measures its own CPU time
(all threads) from the start of the drain until every message is handled and deleted, and
counts its AWS requests with botocore's `before-send` event. For messenger the drain starts
once it is LISTENING and ends once its deleter has had every message deleted (counted from the
DeleteMessageBatch responses) and every event of the drain is in the log (the held lines
written, as the shutdown would); its startup (provisioning or verifying the channel) and its
shutdown (health file to EXITING and EXITED, threads joined: once per process, ~3-5 ms) are
reported apart, `startup_cpu_seconds` and `shutdown_cpu_seconds`, and `cpu_ratio_with_shutdown`
counts the shutdown in. The peer has neither: its clock runs from `start()` until it returns
after the delete batch of the last message. The benchmark's own readings (the threads' CPU,
counting the log lines) are not counted. `messages_per_second` is timed from the
same start (messenger: LISTENING) to the last message handled.

- messenger: `Consumer` as deployed: concurrency 10, JSON event log on (to a file, as a
  container's stderr would be), health file on, messenger.fastboto's fast botocore paths on
  (the verified botocore).
- messenger_plain: the same with plain botocore (MESSENGER_FAST_BOTOCORE=0), as it runs on any
  other botocore: `cpu_ratio_plain_botocore`, and `fast_paths_cpu_saving` (the share of the
  plain drain's CPU the fast paths save).
- peer: `aws_sqs_consumer.Consumer` with `batch_size=10` (its cheapest setting: one receive and
  one delete batch per 10 messages), one thread, its default of asking SQS for no attributes.
  The goal is judged against it.
- peer_attributes: the same, asking for what messenger reads of each message (all message
  attributes: id, routing key, meta headers; receive count, time sent, group): a peer that
  could tell these messages' routing keys and headers. Printed for context
  (`cpu_ratio_same_attributes`).

Messenger's first round also reports its CPU seconds and context switches per thread role
(receiver, deleter, workers, lease keeper, watchdog; `other` holds the startup): where the CPU goes.

Goal: CPU ratio (messenger / peer) <= 1.0, messenger requests/message <= 0.22.
The peer is a benchmark-only dependency: `pip install -r bench/requirements.txt`.

    python bench/peers.py [--rounds 3] [--messages 1000]
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
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CPU_RATIO_GOAL = 1.0
REQUESTS_GOAL = 0.22
CONSUMERS = ("messenger", "messenger_plain", "peer", "peer_attributes")
#: MESSENGER_FAST_BOTOCORE in each consumer's child (None: unset, as deployed: messenger's fast
#: botocore paths on for the verified botocore), whatever the developer's shell has.
FAST_BOTOCORE_SWITCH = {"messenger_plain": "0"}


# -- the children ---------------------------------------------------------------------------
def drain_messenger(queue: str, namespace: str, messages: int,
                    concurrency: int = 10) -> dict[str, Any]:
    import logging

    from messenger.aws import ClientFactory, RequestCounter
    from messenger.consume.consumer import Consumer, ConsumerSettings
    from messenger.consume.lifecycle import configure_json_logging
    from messenger.settings import Settings

    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    configure_json_logging()
    for handler in logging.getLogger().handlers:  # the container's stderr, to a file
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(log)
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
    return {"cpu_seconds": drain_cpu - listening[0], "fast_botocore": clients.fast_paths.on,
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
def backlog(namespace: str, channel: str, messages: int) -> str:
    """A fresh queue holding `messages` messages (pushed by messenger); its URL."""
    from messenger.aws import ClientFactory
    from messenger.channel import queue_name_for
    from messenger.produce.producer import Producer
    from messenger.settings import Settings

    producer = type("Backlog", (Producer,), {"channel": channel})(
        settings=Settings.from_env(namespace=namespace))
    producer.push_many({"n": n, "pad": "x" * 200} for n in range(messages)).raise_for_failures()
    sqs = ClientFactory("us-east-1").client("sqs")
    return str(sqs.get_queue_url(QueueName=queue_name_for(channel, namespace))["QueueUrl"])


def run_child(args: list[str], fast_botocore: str | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "MESSENGER_FAST_BOTOCORE"}
    if fast_botocore is not None:
        env["MESSENGER_FAST_BOTOCORE"] = fast_botocore
    result = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                            timeout=900, env=env)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def measure(rounds: int, messages: int) -> dict[str, Any]:
    namespace = f"p{uuid.uuid4().hex[:6]}"
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONSUMERS}
    for round_number in range(rounds):
        order = CONSUMERS if round_number % 2 == 0 else CONSUMERS[::-1]
        for name in order:
            channel = f"drain_{name}_{round_number}"
            url = backlog(namespace, channel, messages)
            if name.startswith("messenger"):
                args = ["--drain", name, channel, namespace]
            else:
                args = ["--drain", name, url, namespace]
            runs[name].append(run_child([*args, str(messages)], FAST_BOTOCORE_SWITCH.get(name)))
    summary: dict[str, Any] = {}
    for name, found in runs.items():
        assert all(r["handled"] >= messages for r in found), (name, found)
        assert all(r.get("deleted", messages) >= messages for r in found), (name, found)
        assert name != "messenger_plain" or not any(r["fast_botocore"] for r in found)
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
        if "fast_botocore" in found[0]:  # (off with an unverified botocore: see the docs)
            summary[name]["fast_botocore"] = found[0]["fast_botocore"]
    ratio = summary["messenger"]["cpu_seconds_per_1000"] / summary["peer"]["cpu_seconds_per_1000"]
    same = (summary["messenger"]["cpu_seconds_per_1000"]
            / summary["peer_attributes"]["cpu_seconds_per_1000"])
    # messenger's drain plus stopping the consumer (once per process), per 1,000 messages
    stopped = statistics.median(
        (r["cpu_seconds"] + r["shutdown_cpu_seconds"]) * 1000 / messages
        for r in runs["messenger"])
    plain = summary["messenger_plain"]["cpu_seconds_per_1000"]
    requests = summary["messenger"]["requests_per_message"]
    return {
        "messages": messages, "rounds": rounds, **summary,
        "cpu_ratio": round(ratio, 3), "cpu_ratio_goal": CPU_RATIO_GOAL,
        "cpu_ratio_same_attributes": round(same, 3),
        "cpu_ratio_plain_botocore": round(plain / summary["peer"]["cpu_seconds_per_1000"], 3),
        "fast_paths_cpu_saving": round(1 - summary["messenger"]["cpu_seconds_per_1000"] / plain,
                                       3),
        "cpu_ratio_with_shutdown": round(stopped / summary["peer"]["cpu_seconds_per_1000"], 3),
        "requests_goal": REQUESTS_GOAL,
        "meets_goal": ratio <= CPU_RATIO_GOAL and requests <= REQUESTS_GOAL,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
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

    with endpoint_from_env():
        print(json.dumps(measure(args.rounds, args.messages), indent=2))


if __name__ == "__main__":
    main()
