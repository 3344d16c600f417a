"""A Lambda consumer's cold start against a minimal Powertools batch handler doing the same.

Each side runs in a fresh interpreter, as Lambda starts one, from the consumer function's bundle
(`stacks.bundle.consumer_lambda_bundle`: `lambdas/consumer`, `messenger`, the packages it ships,
and a team's code folder, with their bytecode; boto3 from the interpreter's own packages, as the
Lambda runtime provides it; no bytecode written while it runs, as in Lambda's read-only folder).
The child times the import of the function's module and its first invocation with one SQS
message (the channel resolved, the message handled), then reports how many modules it loaded and
whether pydantic, opentelemetry, the status store or idempotency were among them.

- messenger: `lambdas.consumer.handler` running `ColdConsumer` (a `Consumer` whose handler
  decodes nothing more than the runtime does), MESSENGER_PROVISIONING=verify as deployed.
- peer: what a user would write: boto3's SQS client made at import, Powertools'
  `BatchProcessor` + `process_partial_response`, the queue's URL looked up on the first
  invocation (its channel resolved), the JSON body decoded.

Sides alternate within each round (the order flips every round) against a child-process moto
server (AWS_ENDPOINT_URL if set). ROUNDS (BENCH_ROUNDS, default 9); the figures are medians.
Goal (issue 44): messenger's import + first invocation <= 1.3x the peer's. Prints JSON, with the
bundle's size and the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger.aws import ClientFactory  # noqa: E402
from messenger.channel import ChannelSpec  # noqa: E402
from messenger.produce.producer import Producer  # noqa: E402
from messenger.provision import Provisioner  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402
from stacks.bundle import consumer_lambda_bundle  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "9"))
TARGET = 1.3
CHANNEL = "coldstart"
#: Modules a consumer that uses none of these features must not load.
OPTIONAL = ("pydantic", "opentelemetry", "messenger.jobs.status", "messenger.consume.tracking",
            "messenger.consume.idempotency", "aws_lambda_powertools.utilities.idempotency")

CONSUMER_CODE = f'''
from messenger import Consumer


class ColdConsumer(Consumer):
    channel = "{CHANNEL}"

    def handler(self, message):
        return None
'''

PEER_CODE = '''
import json
import os

import boto3
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)

processor = BatchProcessor(event_type=EventType.SQS)
sqs = boto3.client("sqs")
queue_url = None


def record_handler(record):
    json.loads(record.body)


def handler(event, context):
    global queue_url
    if queue_url is None:
        queue_url = sqs.get_queue_url(QueueName=os.environ["PEER_QUEUE_NAME"])["QueueUrl"]
    return process_partial_response(event=event, record_handler=record_handler,
                                    processor=processor, context=context)
'''

#: The child: nothing imported before the clock starts but json, sys and time.
CHILD = '''
import json, sys, time
started = time.perf_counter()
import importlib
module = importlib.import_module(sys.argv[1])
imported = time.perf_counter()


class Context:
    function_name = "coldstart"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:coldstart"
    aws_request_id = "cold-1"

    def get_remaining_time_in_millis(self):
        return 60_000


with open(sys.argv[2]) as file:
    event = json.load(file)
invoked = time.perf_counter()
response = module.handler(event, Context())
done = time.perf_counter()
optional = sys.argv[3].split(",")
print(json.dumps({
    "import_ms": (imported - started) * 1000, "first_invocation_ms": (done - invoked) * 1000,
    "response": response, "modules": len(sys.modules),
    "optional_loaded": sorted(n for n in optional
                              if any(m == n or m.startswith(n + ".") for m in sys.modules)),
}))
'''


def bundle_size(path: Path) -> dict[str, Any]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return {"bytes": sum(p.stat().st_size for p in files), "files": len(files),
            "mib": round(sum(p.stat().st_size for p in files) / 2**20, 2)}


def one_event(settings: Settings, clients: ClientFactory, workdir: Path, name: str) -> Path:
    """Push one message and receive it as the event source would; its event in a file."""
    from messenger.consume.lambda_runtime import sqs_event

    class ColdProducer(Producer):
        channel = CHANNEL

    ColdProducer(settings=settings, clients=clients).push({"n": 1, "side": name})
    sqs = clients.client("sqs")
    url = sqs.get_queue_url(QueueName=ChannelSpec(CHANNEL, namespace=settings.namespace)
                            .queue_name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=5,
                                   AttributeNames=["All"], MessageAttributeNames=["All"],
                                   VisibilityTimeout=60)["Messages"]
    path = workdir / f"event-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(sqs_event(messages, arn, clients.region)))
    for message in messages:  # the Lambda service would delete it (no failure reported)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return path


def run_child(module: str, event: Path, bundle: Path, env: dict[str, str],
              child: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(child), module, str(event), ",".join(OPTIONAL)],
        env={**env, "PYTHONPATH": str(bundle)}, cwd=str(bundle), capture_output=True,
        text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{module}: exit {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    failures = result["response"].get("batchItemFailures")
    if failures:
        raise RuntimeError(f"{module}: the message was not handled: {result['response']}")
    result["total_ms"] = result["import_ms"] + result["first_invocation_ms"]
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "import_ms": round(statistics.median(r["import_ms"] for r in runs), 1),
        "first_invocation_ms": round(statistics.median(r["first_invocation_ms"] for r in runs),
                                     1),
        "total_ms": round(statistics.median(r["total_ms"] for r in runs), 1),
        "modules": runs[-1]["modules"],
        "optional_loaded": runs[-1]["optional_loaded"],
    }


def measure(settings: Settings) -> dict[str, Any]:
    clients = ClientFactory(settings.region)
    spec = ChannelSpec(CHANNEL, namespace=settings.namespace)
    Provisioner(clients, settings).ensure_channel(spec)
    workdir = Path(tempfile.mkdtemp(prefix="coldstart-"))
    code = workdir / "coldstart_app"
    code.mkdir()
    (code / "__init__.py").write_text("")
    (code / "consumer.py").write_text(CONSUMER_CODE)
    (code / "peer.py").write_text(PEER_CODE)
    bundle = consumer_lambda_bundle(code)
    child = workdir / "child.py"
    child.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESSENGER_")}
    env.update({"MESSENGER_NAMESPACE": settings.namespace, "MESSENGER_PROVISIONING": "verify",
                "MESSENGER_CONSUMER": "coldstart_app.consumer:ColdConsumer",
                "PEER_QUEUE_NAME": spec.queue_name, "AWS_DEFAULT_REGION": settings.region,
                "PYTHONDONTWRITEBYTECODE": "1"})
    sides = {"messenger": "lambdas.consumer.handler", "peer": "coldstart_app.peer"}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    # a first pair warms the file cache and writes nothing (no bytecode either way)
    order = list(sides)
    for number in range(ROUNDS + 1):
        for name in order if number % 2 == 0 else reversed(order):
            result = run_child(sides[name], one_event(settings, clients, workdir, name),
                               bundle, env, child)
            if number:
                runs[name].append(result)
    mine, peer = summarize(runs["messenger"]), summarize(runs["peer"])
    ratios = [m["total_ms"] / p["total_ms"]
              for m, p in zip(runs["messenger"], runs["peer"], strict=True)]
    ratio = statistics.median(ratios)
    return {
        "rounds": ROUNDS,
        "messenger": mine,
        "peer": peer,
        "ratio": round(ratio, 3),
        "round_ratios": [round(r, 3) for r in ratios],
        "import_ratio": round(mine["import_ms"] / peer["import_ms"], 3),
        "target_ratio": TARGET,
        "meets_target": ratio <= TARGET and not mine["optional_loaded"],
        "bundle": bundle_size(bundle),
        "python": sys.version.split()[0],
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "bytecode_in_bundle": any(bundle.rglob("*.pyc")),
        "note": "both sides import from the same bundle, with the bytecode it ships (none "
                "written at run time: Lambda's folder is read-only); the interpreter's own "
                "start is the same for both and not counted",
    }


def main() -> dict[str, Any]:
    with endpoint_from_env():
        return measure(Settings.from_env(namespace=f"c{uuid.uuid4().hex[:6]}"))


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
