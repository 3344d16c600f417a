"""AWS API calls of the ops Lambdas over 1,000 platform queues (each with its DLQ).

Target: the queue alarm uses <= 25 AWS calls per run with 1,000 queues (names through
ListQueues, metrics through GetMetricData with up to 500 queries per call, the tags of the
queues holding messages through the Resource Groups Tagging API by ARN), measured twice: with
the provisioner's tags, and with 3 CloudFormation + 3 cost tags more on every queue. The
resource cleaner's CloudWatch calls: <= 12. Its other calls are printed too.

Runs against the embedded local endpoint (a child process) or AWS_ENDPOINT_URL if set. Requests
are counted with botocore's 'before-send' event (retries included). The handlers also read the
webhook secret once per invocation (GetSecretValue, cached 5 minutes): +1 call, shown apart.
Prints JSON. Takes about 3 minutes on the local endpoint, nearly all of it inside moto, whose
GetMetricData scans every stored datapoint for each query (production CloudWatch does not).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.channel import ChannelSpec, ChannelTags  # noqa: E402
from messenger.ops.cleaner import run_resource_cleaner  # noqa: E402
from messenger.ops.queue_alarm import run_queue_alarm  # noqa: E402
from messenger.ops.report import render_text  # noqa: E402
from messenger.ops.settings import OpsSettings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

QUEUES = 1_000
EXCHANGES = 20
#: Queues 0..199 hang off the 20 exchanges (10 each); the rest are single-consumer channels.
EXCHANGE_QUEUES = 200
TARGET_ALARM_CALLS = 25
TARGET_CLEANER_CLOUDWATCH_CALLS = 12
#: What CloudFormation adds to every resource it creates, plus typical cost-allocation tags.
DEPLOYMENT_TAGS = {
    "aws:cloudformation:stack-name": "shop-prod",
    "aws:cloudformation:logical-id": "OrdersQueue0A1B2C3D",
    "aws:cloudformation:stack-id": "arn:aws:cloudformation:us-east-1:123456789012:stack/"
                                   "shop-prod/0a1b2c3d-1111-2222-3333-444455556666",
    "cost-center": "cc-1234", "environment": "production", "application": "shop",
}
#: The cleaner runs "four days later" so that every queue is old enough to be judged.
LATER = timedelta(days=4)


class RecordingNotifier:
    """Keeps the reports instead of posting them (Slack is not an AWS call)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def prepare(self) -> None:
        pass

    def post(self, message: dict[str, Any]) -> bool:
        self.messages.append(message)
        return True


def specs(namespace: str) -> list[ChannelSpec]:
    made = []
    for n in range(QUEUES):
        name = f"ex{n % EXCHANGES:02d}.q{n:04d}" if n < EXCHANGE_QUEUES else f"q{n:04d}"
        tags = ChannelTags(owner="bench", team=f"team{n % 7}", alarm_threshold=100,
                           critical=n % 50 == 0)
        made.append(ChannelSpec(name, namespace=namespace, tags=tags))
    return made


def build(clients: ClientFactory, all_specs: list[ChannelSpec]) -> None:
    """Queues, DLQs, topics and subscriptions, tagged as the provisioner tags them."""
    sqs, sns = clients.client("sqs"), clients.client("sns")
    topics = {}
    for spec in all_specs:
        if spec.topic_name and spec.topic_name not in topics:
            topics[spec.topic_name] = sns.create_topic(
                Name=spec.topic_name,
                Tags=[{"Key": k, "Value": v} for k, v in spec.resource_tags("topic").items()],
            )["TopicArn"]

    def one(spec: ChannelSpec) -> str:
        dlq = sqs.create_queue(QueueName=spec.dlq_name, tags=spec.resource_tags("dlq"))
        dlq_arn = sqs.get_queue_attributes(
            QueueUrl=dlq["QueueUrl"], AttributeNames=["QueueArn"]
        )["Attributes"]["QueueArn"]
        attributes = {"RedrivePolicy": json.dumps(spec.redrive_policy(dlq_arn))}
        sqs.create_queue(
            QueueName=spec.queue_name, Attributes=attributes, tags=spec.resource_tags("queue")
        )
        return dlq_arn.replace(spec.dlq_name, spec.queue_name)

    with ThreadPoolExecutor(16) as pool:
        queue_arns = list(pool.map(one, all_specs))
    # One at a time: moto answers concurrent Subscribe calls with a 500 now and then (its
    # subscription list is not thread-safe); 200 calls take about a second.
    for spec, arn in zip(all_specs, queue_arns, strict=True):
        if spec.topic_name:
            sns.subscribe(TopicArn=topics[spec.topic_name], Protocol="sqs", Endpoint=arn)


def add_deployment_tags(clients: ClientFactory, all_specs: list[ChannelSpec]) -> None:
    """Tag every queue and DLQ with DEPLOYMENT_TAGS (moto accepts aws: tags from a client)."""
    sqs = clients.client("sqs")

    def one(spec: ChannelSpec) -> None:
        for name in (spec.queue_name, spec.dlq_name):
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            sqs.tag_queue(QueueUrl=url, Tags=DEPLOYMENT_TAGS)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, all_specs))


def seed(clients: ClientFactory, all_specs: list[ChannelSpec], now: datetime) -> None:
    """Metrics as SQS/SNS would report them: depth for every queue, 10% over threshold; three
    days of traffic, mostly busy, a few idle or one-sided queues. Written by hand: the local
    endpoint publishes only what happens while it runs (and leaves these queues to them)."""
    data: dict[str, list[dict[str, Any]]] = {"AWS/SQS": [], "AWS/SNS": []}

    def point(ns: str, dim: str, name: str, metric: str, value: float, at: datetime) -> None:
        data[ns].append({"MetricName": metric, "Dimensions": [{"Name": dim, "Value": name}],
                         "Timestamp": at, "Value": value})

    real_now = datetime.now(UTC)
    for n, spec in enumerate(all_specs):
        depth = 150.0 if n % 10 == 0 else 5.0
        point("AWS/SQS", "QueueName", spec.queue_name, "ApproximateNumberOfMessagesVisible",
              depth, real_now - timedelta(minutes=3))
        point("AWS/SQS", "QueueName", spec.queue_name, "ApproximateAgeOfOldestMessage",
              600.0, real_now - timedelta(minutes=3))
        if n % 25 == 0:
            point("AWS/SQS", "QueueName", spec.dlq_name, "ApproximateNumberOfMessagesVisible",
                  120.0, real_now - timedelta(minutes=3))
        kind = n % 20
        at = now - timedelta(hours=6)
        if kind < 16:  # busy
            sent, received = 100.0, 100.0
        elif kind == 16:  # no consumers
            sent, received = 40.0, 0.0
        elif kind == 17:  # no producers (polled)
            sent, received = 0.0, 0.0
            point("AWS/SQS", "QueueName", spec.queue_name, "NumberOfEmptyReceives", 500.0, at)
        else:  # idle: no data at all
            continue
        point("AWS/SQS", "QueueName", spec.queue_name, "NumberOfMessagesSent", sent, at)
        point("AWS/SQS", "QueueName", spec.queue_name, "NumberOfMessagesReceived", received, at)
    for spec in all_specs[:EXCHANGES]:  # half of the exchanges are active
        if spec.exchange and int(spec.exchange[2:]) % 2 == 0:
            point("AWS/SNS", "TopicName", spec.topic_name or "", "NumberOfMessagesPublished",
                  10.0, now - timedelta(hours=2))
    cloudwatch = clients.client("cloudwatch")
    for namespace, items in data.items():
        for start in range(0, len(items), 500):
            cloudwatch.put_metric_data(Namespace=namespace, MetricData=items[start : start + 500])


def counted(clients: ClientFactory, work: Any) -> tuple[Any, dict[str, Any]]:
    counter = RequestCounter().attach(clients)
    started = time.perf_counter()
    result = work()
    elapsed = time.perf_counter() - started
    counter.detach(clients)
    return result, {
        "aws_calls": counter.total,
        "by_operation": dict(sorted(counter.counts.items())),
        "seconds": round(elapsed, 2),
    }


def main() -> dict[str, Any]:
    with endpoint_from_env():
        namespace = f"b{uuid.uuid4().hex[:6]}"
        clients = ClientFactory(os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        settings = OpsSettings("unused-here", namespace=namespace, default_alarm_threshold=100)
        all_specs = specs(namespace)
        started = time.perf_counter()
        build(clients, all_specs)
        later = datetime.now(UTC) + LATER
        seed(clients, all_specs, later)
        results: dict[str, Any] = {
            "queues": QUEUES, "dlqs": QUEUES, "topics": EXCHANGES,
            "setup_seconds": round(time.perf_counter() - started, 1),
        }
        for scope in ("source", "dlq"):
            notifier = RecordingNotifier()
            outcome, figures = counted(
                clients, lambda s=scope, n=notifier: run_queue_alarm(
                    {"scope": s}, clients, settings, n)
            )
            figures["problems"] = len(outcome.report.problems)
            figures["critical"] = len(outcome.report.critical)
            figures["slack_blocks"] = sum(len(m["blocks"]) for m in notifier.messages)
            results[f"queue_alarm.{scope}"] = figures
        # The same queues as CloudFormation deploys them (3 aws:cloudformation:* tags) with 3
        # cost-allocation tags: 6 more tags per queue
        add_deployment_tags(clients, all_specs)
        for scope in ("source", "dlq"):
            outcome, figures = counted(
                clients, lambda s=scope: run_queue_alarm(
                    {"scope": s}, clients, settings, RecordingNotifier())
            )
            figures["problems"] = len(outcome.report.problems)
            results[f"queue_alarm.{scope}.cloudformation_and_cost_tags"] = figures
        notifier = RecordingNotifier()
        outcome, figures = counted(
            clients, lambda: run_resource_cleaner(clients, settings, notifier, now=later)
        )
        figures["summary"] = {k: len(v) if isinstance(v, list) else v
                              for k, v in outcome.summary().items()}
        figures["cloudwatch_calls"] = sum(
            n for op, n in figures["by_operation"].items() if op.startswith("cloudwatch."))
        figures["slack_posts"] = len(notifier.messages)
        results["resource_cleaner"] = figures
        results["handler_extra_calls"] = {"secretsmanager.GetSecretValue": 1}
        results["target_queue_alarm_calls"] = TARGET_ALARM_CALLS
        results["queue_alarm_meets_target"] = all(
            results[key]["aws_calls"] + 1 <= TARGET_ALARM_CALLS
            for key in results if key.startswith("queue_alarm.")
        )
        results["target_cleaner_cloudwatch_calls"] = TARGET_CLEANER_CLOUDWATCH_CALLS
        results["cleaner_meets_target"] = (
            results["resource_cleaner"]["cloudwatch_calls"] <= TARGET_CLEANER_CLOUDWATCH_CALLS)
        if os.environ.get("BENCH_SHOW_REPORTS") and notifier.messages:
            print(render_text(notifier.messages[0]), file=sys.stderr)
        return results


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
