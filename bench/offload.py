"""Offloaded payloads through S3: messenger against AWS's `amazon-sqs-extended-client` (PyPI).

Each round sends 20 messages of 600 KiB (JSON: a list of order lines) and receives them back,
once with messenger and once with the extended client, on the same local endpoint (moto server
in a child process), alternating which goes first from round to round. Each side runs in a
child process of its own (importing the extended client replaces `boto3.session.Session` in
the whole process) and has made its clients and sent, received and deleted one offloaded
message before the clock starts (so neither pays for provisioning, a bucket, or its first
connections in the figures).

- send: wall time to send the 20 bodies one at a time. messenger: `Producer.push(body)` (JSON
  encoding, checks, S3 PutObject with SSE-KMS, SendMessage). Peer: `json.dumps(body)` then
  `send_message` on `boto3.client("sqs")` after importing it, with `large_payload_support` set to
  a bucket, as its README shows (PutObject, SendMessage).
- receive window: from the first ReceiveMessage request going out to the response of the
  DeleteMessageBatch that deleted the last of the 20, both read from botocore's events the same
  way for both sides (`before-send` of each of the side's clients, which also counts the
  requests in the window, and `after-call` of DeleteMessageBatch). messenger: a `Consumer` as
  deployed (concurrency `--concurrency`, default 10; JSON event log to a file, health file on),
  started after the send on the client factory the warm-up's consumer used; its startup is not
  in the window. Peer: the loop its README shows: `receive_message(MaxNumberOfMessages=10,
  MessageAttributeNames=["All"])` (it reads each body from S3 inside the call), `json.loads` of
  each body, then `delete_message_batch` of the receive's messages (one request per receive, its
  cheapest). Neither deletes the S3 objects (the extended client's default,
  `delete_payload_from_s3=False`, the same guarantee as messenger's, which never does: a
  lifecycle rule expires them; its README's delete example sets True, which would add a
  DeleteObject per message, made before the message's delete).
- Every body received is checked against what was sent (after the clock stops).

Goal: send and receive-window ratios (messenger / peer, medians over the rounds) <= 1.0.
Prints JSON, with each round's figures and the load average before and after.

    python bench/offload.py [--rounds 5] [--messages 20] [--kib 600] [--concurrency 10]
"""

from __future__ import annotations

import argparse
import collections
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

from bench.harness import json_log_to_file  # noqa: E402

GOAL = 1.0
SIDES = ("messenger", "peer")


def payload(n: int, kib: int) -> dict[str, Any]:
    """A JSON body of about `kib` KiB: order `n` with its lines (varied ASCII text)."""
    lines = []
    size = 0
    line = 0
    while size < kib * 1024 - 200:
        item = {"line": line, "sku": f"SKU-{n:04d}-{line:06d}", "qty": line % 7 + 1,
                "price": round(1 + (line * 37 % 1000) / 7, 2),
                "note": f"order {n} line {line}: deliver to dock {line % 13}, fragile"}
        lines.append(item)
        size += len(json.dumps(item)) + 1
        line += 1
    return {"order": n, "lines": lines}


class Window:
    """The receive window, read from botocore events: first ReceiveMessage sent to the
    DeleteMessageBatch response that brings the deleted count to `expected`."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.first_receive: float | None = None
        self.deleted = 0
        self.done = threading.Event()
        self.ended = 0.0
        #: CPU seconds of the process (all threads) in the window.
        self.cpu = 0.0
        self.cpu_started = 0.0
        #: Requests in the window, by service.Operation.
        self.requests: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def on_send(self, event_name: str = "", **_: Any) -> None:
        """botocore `before-send` of every client of the side: starts the window at the first
        ReceiveMessage and counts the requests in it."""
        operation = ".".join(event_name.split(".")[1:3])
        with self._lock:
            if self.first_receive is None and operation == "sqs.ReceiveMessage":
                self.first_receive = time.perf_counter()
                self.cpu_started = time.process_time()
            if self.first_receive is not None and not self.done.is_set():
                self.requests[operation] += 1

    def on_deleted(self, parsed: Any = None, **_: Any) -> None:
        with self._lock:
            self.deleted += len((parsed or {}).get("Successful", []))
            if self.deleted >= self.expected and not self.done.is_set():
                self.ended = time.perf_counter()
                self.cpu = time.process_time() - self.cpu_started
                self.done.set()

    @property
    def seconds(self) -> float:
        assert self.first_receive is not None
        return self.ended - self.first_receive


# -- the children ---------------------------------------------------------------------------
def run_messenger(channel: str, namespace: str, messages: int, kib: int,
                  concurrency: int) -> dict[str, Any]:

    from messenger.aws import ClientFactory, RequestCounter
    from messenger.consume.consumer import Consumer, ConsumerSettings
    from messenger.produce.producer import Producer
    from messenger.settings import Settings

    log = json_log_to_file()
    # The extended client's threshold (256 KiB): both sides offload the same bodies (a queue's
    # default is 1 MiB, which would send them inline; bench/threshold.py compares in dollars).
    settings = Settings.from_env(namespace=namespace, offload_threshold=256 * 1024)
    sending, receiving = ClientFactory(settings.region), ClientFactory(settings.region)
    producer = type("OffloadBench", (Producer,), {"channel": channel})(
        settings=settings, clients=sending)
    got: dict[int, Any] = {}
    lock = threading.Lock()

    class Drain(Consumer):
        def handler(self, message: Any) -> None:
            with lock:
                got[message.body["order"]] = message.body

    Drain.channel = channel
    health = os.path.join(tempfile.mkdtemp(), "health.json")

    def consume(window: Window) -> bool:
        consumer = Drain(settings=settings, clients=receiving,
                         runtime=ConsumerSettings(concurrency=concurrency, health_file=health))
        thread = threading.Thread(target=consumer.run, daemon=True)
        thread.start()
        finished = window.done.wait(300)
        consumer.request_shutdown()
        thread.join(60)
        return finished

    # Warm-up: provisions the queue and the bucket, makes the clients of both sides (a consumer
    # on the same client factory as the measured one) and sends, receives and deletes one.
    warm = Window(1)
    receiving.register("after-call.sqs.DeleteMessageBatch", warm.on_deleted)
    producer.push(payload(-1, kib))
    assert consume(warm), "the warm-up message was not consumed"
    receiving.unregister("after-call.sqs.DeleteMessageBatch", warm.on_deleted)

    bodies = [payload(n, kib) for n in range(messages)]
    sent_counter = RequestCounter().attach(sending)
    started = time.perf_counter()
    for body in bodies:
        producer.push(body)
    send_seconds = time.perf_counter() - started
    sent_counter.detach(sending)

    window = Window(messages)
    receiving.register("before-send", window.on_send)
    receiving.register("after-call.sqs.DeleteMessageBatch", window.on_deleted)
    finished = consume(window)
    os.unlink(log.name)
    return {"send_seconds": send_seconds, "receive_seconds": window.seconds if finished else None,
            "receive_cpu_seconds": window.cpu,
            "intact": finished and [got.get(n) for n in range(messages)] == bodies,
            "send_requests": dict(sent_counter.counts),
            "receive_requests": dict(window.requests)}


def run_peer(channel: str, namespace: str, messages: int, kib: int) -> dict[str, Any]:
    import boto3
    import sqs_extended_client  # noqa: F401  (replaces boto3.session.Session: its README)

    from messenger.aws import RequestCounter

    bucket = f"{namespace}-{channel}".replace("_", "-")[:63]
    # As its README: boto3.client("sqs") after the import, large_payload_support set to a bucket
    sender = boto3.client("sqs", region_name="us-east-1")
    receiver = boto3.client("sqs", region_name="us-east-1")
    for client in (sender, receiver):
        client.large_payload_support = bucket
    sender.s3_client.create_bucket(Bucket=bucket)
    url = sender.create_queue(QueueName=f"{namespace}-{channel}")["QueueUrl"]
    # Warm-up, as for messenger: one offloaded message sent, received and deleted.
    sender.send_message(QueueUrl=url, MessageBody=json.dumps(payload(-1, kib)))
    warm = receiver.receive_message(QueueUrl=url, WaitTimeSeconds=5,
                                    MessageAttributeNames=["All"])
    for message in warm.get("Messages", []):
        receiver.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])

    bodies = [payload(n, kib) for n in range(messages)]
    sent_counter = RequestCounter()
    for client in (sender, sender.s3_client):
        client.meta.events.register("before-send", sent_counter)
    started = time.perf_counter()
    for body in bodies:
        sender.send_message(QueueUrl=url, MessageBody=json.dumps(body, separators=(",", ":")))
    send_seconds = time.perf_counter() - started

    window = Window(messages)
    for client in (receiver, receiver.s3_client):
        client.meta.events.register("before-send", window.on_send)
    receiver.meta.events.register("after-call.sqs.DeleteMessageBatch", window.on_deleted)
    got: dict[int, Any] = {}
    while len(got) < messages:
        response = receiver.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                            WaitTimeSeconds=20, MessageAttributeNames=["All"])
        received = response.get("Messages", [])
        for message in received:
            body = json.loads(message["Body"])  # the handler
            got[body["order"]] = body
        if received:
            receiver.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(received)])
    window.done.wait(5)
    return {"send_seconds": send_seconds,
            "receive_seconds": window.seconds if window.done.is_set() else None,
            "receive_cpu_seconds": window.cpu,
            "intact": [got.get(n) for n in range(messages)] == bodies,
            "send_requests": dict(sent_counter.counts),
            "receive_requests": dict(window.requests)}


# -- the parent ------------------------------------------------------------------------------
def run_child(args: list[str]) -> dict[str, Any]:
    result = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                            timeout=600)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def measure(rounds: int, messages: int, kib: int, concurrency: int) -> dict[str, Any]:
    namespace = f"o{uuid.uuid4().hex[:6]}"
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for round_number in range(rounds):
        order = SIDES if round_number % 2 == 0 else SIDES[::-1]
        for side in order:
            channel = f"offload_{side}_{round_number}"
            runs[side].append(run_child(["--side", side, channel, namespace, str(messages),
                                         str(kib), str(concurrency)]))
    summary: dict[str, Any] = {}
    for side, found in runs.items():
        assert all(r["intact"] for r in found), (side, "bodies did not round-trip")
        summary[side] = {
            "send_seconds": round(statistics.median(r["send_seconds"] for r in found), 4),
            "receive_seconds": round(statistics.median(r["receive_seconds"] for r in found), 4),
            "send_and_receive": "{:.3f} / {:.3f}".format(
                statistics.median(r["send_seconds"] for r in found),
                statistics.median(r["receive_seconds"] for r in found)),
            "receive_cpu_seconds": round(statistics.median(
                r["receive_cpu_seconds"] for r in found), 4),
            "send_seconds_rounds": [round(r["send_seconds"], 4) for r in found],
            "receive_seconds_rounds": [round(r["receive_seconds"], 4) for r in found],
            "send_requests": found[0]["send_requests"],
            "receive_requests": found[0]["receive_requests"],
        }
    mine, peer = summary["messenger"], summary["peer"]
    send_ratio = mine["send_seconds"] / peer["send_seconds"]
    receive_ratio = mine["receive_seconds"] / peer["receive_seconds"]
    # Per round (the two sides of a round ran back to back): the spread of the ratio.
    round_ratios = [
        (m["send_seconds"] + m["receive_seconds"]) / (p["send_seconds"] + p["receive_seconds"])
        for m, p in zip(runs["messenger"], runs["peer"], strict=True)
    ]
    total = (mine["send_seconds"] + mine["receive_seconds"]) / (
        peer["send_seconds"] + peer["receive_seconds"])
    return {
        "messages": messages, "kib": kib, "rounds": rounds, "concurrency": concurrency,
        **summary,
        "send_ratio": round(send_ratio, 3), "receive_ratio": round(receive_ratio, 3),
        "total_ratio": round(total, 3),
        "total_ratio_rounds": [round(r, 3) for r in round_ratios],
        "goal": GOAL,
        "meets_goal": send_ratio <= GOAL and receive_ratio <= GOAL,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--kib", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--side", nargs=6,
                        metavar=("WHO", "CHANNEL", "NAMESPACE", "N", "KIB", "CONCURRENCY"))
    args = parser.parse_args()
    if args.side:
        who, channel, namespace, count, kib, concurrency = args.side
        os.environ["MESSENGER_NAMESPACE"] = namespace
        result = (run_messenger(channel, namespace, int(count), int(kib), int(concurrency))
                  if who == "messenger" else run_peer(channel, namespace, int(count), int(kib)))
        print(json.dumps(result))
        return
    from messenger.tools.local import endpoint_from_env

    with endpoint_from_env():
        print(json.dumps(measure(args.rounds, args.messages, args.kib, args.concurrency),
                         indent=2))


if __name__ == "__main__":
    main()
