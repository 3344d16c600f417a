"""The embedded endpoint's SQS at depth: time per request at depth 0 and at depth 10,000, for
messenger's indexed server and for stock moto, in one run.

Two servers run side by side (`messenger local` and `messenger local --stock-moto`, each a child
process). On each, a standard and a FIFO queue are empty and another pair holds `--depth`
messages (FIFO: spread over 100 groups). Rounds alternate between the servers; each round does,
per queue, one SendMessageBatch of 10 and one ReceiveMessage of up to 10 (both timed, wall clock
on the client, HTTP included), then deletes what it received, so depths stay put; stock moto's
deep queues take part in the first `--stock-deep-rounds` only (a request there takes seconds to
a minute). Prints JSON:
median seconds per request per cell and the ratio depth/empty per server (target: ≤ 2 indexed).

The deep queues are filled inside each server process with the messages `SendMessage` would
make: over HTTP stock moto would need about half an hour for 10,000 (each send scans the queue).

    python bench/local_endpoint.py [--depth 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROUPS = 100
BATCH = 10


def serve(stock_moto: bool) -> None:
    """Child mode: run an endpoint; on stdin `fill <queue url> <n>` adds n messages in-process."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.moto_api._internal import mock_random
    from moto.sqs.models import Message, sqs_backends

    from messenger.tools.local import LocalEndpoint

    endpoint = LocalEndpoint(stock_moto=stock_moto).start()
    print(f"AWS_ENDPOINT_URL={endpoint.url}", flush=True)
    for line in sys.stdin:
        _, url, count = line.split()
        queue = sqs_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_queue(url.rsplit("/", 1)[-1])
        messages = []
        for i in range(int(count)):
            message = Message(str(mock_random.uuid4()), f"prefill-{i}")
            if queue.fifo_queue:
                message.group_id = f"g{i % GROUPS}"
                message.deduplication_id = f"prefill-{i}"
            message.mark_sent()
            messages.append(message)
        if stock_moto:  # what stock add_message appends (its FIFO dedup scan would find nothing)
            queue._messages.extend(messages)
        else:
            for message in messages:
                queue.add_message(message)
        print("filled", flush=True)
    endpoint.stop()


class Server:
    """A child process in `serve` mode, with its SQS client and queues."""

    def __init__(self, name: str, stock_moto: bool) -> None:
        import subprocess

        import boto3

        from messenger.tools.local import LOCAL_CREDENTIALS

        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve"] + (["--stock-moto"] if stock_moto else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        url = self.process.stdout.readline().strip().split("=", 1)[1]
        self.sqs = boto3.client(
            "sqs",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        self.queues: dict[str, str] = {}
        self.sent = 0

    def create(self, key: str, fifo: bool) -> None:
        name = f"bench-{key}" + (".fifo" if fifo else "")
        attributes = {"FifoQueue": "true"} if fifo else {}
        self.queues[key] = self.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]

    def fill(self, key: str, count: int) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"fill {self.queues[key]} {count}\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "filled"

    def depth(self, key: str) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.queues[key], AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"])

    def round(self, key: str) -> tuple[float, float]:
        """One timed batched send and one timed receive; then delete what was received."""
        url = self.queues[key]
        entries = []
        for i in range(BATCH):
            self.sent += 1
            entry: dict[str, Any] = {"Id": f"e{i}", "MessageBody": f"round-{self.sent}"}
            if key.startswith("fifo"):
                entry.update(MessageGroupId=f"g{i}", MessageDeduplicationId=f"r{self.sent}")
            entries.append(entry)
        started = time.perf_counter()
        self.sqs.send_message_batch(QueueUrl=url, Entries=entries)
        sent = time.perf_counter()
        received = self.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=BATCH, VisibilityTimeout=600
        ).get("Messages", [])
        done = time.perf_counter()
        if received:
            self.sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(received)
                ],
            )
        return sent - started, done - sent

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except Exception:
            self.process.kill()
            self.process.wait()


def main(depth: int, rounds: int, stock_deep: int) -> dict[str, Any]:
    servers = [Server("indexed", stock_moto=False), Server("stock", stock_moto=True)]
    keys = ("standard-0", "standard-deep", "fifo-0", "fifo-deep")
    try:
        for server in servers:
            for key in keys:
                server.create(key, fifo=key.startswith("fifo"))
        fills = [  # the two servers fill at once; each fills its queues in turn
            threading.Thread(
                target=lambda s=s: [s.fill(k, depth) for k in keys if k.endswith("deep")]
            )
            for s in servers
        ]
        for fill in fills:
            fill.start()
        for fill in fills:
            fill.join()
        timings: dict[str, dict[str, list[float]]] = {
            f"{s.name}.{k}": {"send_batch": [], "receive": []} for s in servers for k in keys
        }
        for server in servers:  # warm-up, not timed: first requests pay for imports
            for key in keys:
                if not key.endswith("deep"):
                    server.round(key)
        for number in range(rounds):
            for server in servers:  # alternate: each round visits both servers
                for key in keys:
                    if server.name == "stock" and key.endswith("deep") and number >= stock_deep:
                        continue  # a stock request at depth takes tens of seconds
                    send, receive = server.round(key)
                    timings[f"{server.name}.{key}"]["send_batch"].append(send)
                    timings[f"{server.name}.{key}"]["receive"].append(receive)
        result: dict[str, Any] = {
            "depth": depth,
            "rounds": rounds,
            "stock_deep_rounds": min(stock_deep, rounds),
            "batch": BATCH,
        }
        for server in servers:
            per: dict[str, Any] = {}
            for key in keys:
                cell = timings[f"{server.name}.{key}"]
                per[key] = {op: round(statistics.median(v), 4) for op, v in cell.items()}
                per[key]["samples"] = len(cell["receive"])
                per[key]["depth_after"] = server.depth(key)
            for kind in ("standard", "fifo"):
                for op in ("send_batch", "receive"):
                    per[f"{kind}.{op}.ratio_deep_vs_empty"] = round(
                        per[f"{kind}-deep"][op] / per[f"{kind}-0"][op], 2
                    )
            result[server.name] = per
        indexed = result["indexed"]
        result["indexed_worst_ratio"] = max(
            v for k, v in indexed.items() if k.endswith("ratio_deep_vs_empty")
        )
        return result
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--stock-deep-rounds",
        type=int,
        default=1,
        help="rounds that include stock moto's deep queues (each takes about a minute)",
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stock-moto", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.stock_moto)
    else:
        print(json.dumps(main(args.depth, args.rounds, args.stock_deep_rounds), indent=2))
