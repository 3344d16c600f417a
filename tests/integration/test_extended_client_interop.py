"""Interop with AWS's own `amazon-sqs-extended-client` (PyPI): its large messages, current and
legacy pointer formats, reach a messenger consumer; messenger's offloaded messages read back
through AWS's client; and importing it (which replaces `boto3.session.Session` process-wide)
does not break messenger's own clients. Runs in a child process, so that the patch stays there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import json, sys, threading, time
    import boto3
    genuine = boto3.session.Session
    import sqs_extended_client  # replaces boto3.session.Session in the whole process
    from messenger import Consumer, ConsumerSettings, Producer, Settings
    from messenger.aws import ClientFactory
    from messenger.channel import queue_name_for

    assert boto3.session.Session is not genuine, "the package no longer patches boto3"
    settings = Settings.from_env(retry_budget_seconds=5.0)
    channel = "interop"

    class Sink(Consumer):
        handled = []

        def handler(self, message):
            self.handled.append((message.body, message.receive_count))

        def on_event(self, event):
            if event.name in ("delete_failed", "dead_lettered", "failed", "heartbeat_failed"):
                print("EVENT", event.name, event.fields, file=sys.stderr)
                self.bad.append(event.name)
            super().on_event(event)

    Sink.channel = channel
    Sink.bad = []
    producer = type("P", (Producer,), {"channel": channel})(settings=settings)
    producer.push({"warm": "up"})  # provisions the channel (queue, DLQ, offload bucket)

    factory = ClientFactory("us-east-1")
    queue_url = factory.client("sqs").get_queue_url(
        QueueName=queue_name_for(channel, settings.namespace))["QueueUrl"]

    # AWS's extended client, both pointer formats, 300 KB bodies through S3
    s3 = factory.client("s3")
    s3.create_bucket(Bucket="aws-extended-payloads")
    aws_sqs = boto3.session.Session(region_name="us-east-1").client("sqs")
    aws_sqs.large_payload_support = "aws-extended-payloads"
    sent = []
    for legacy in (False, True):
        aws_sqs.use_legacy_attribute = legacy
        body = {"legacy": legacy, "pad": "x" * 300_000}
        aws_sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(body))
        sent.append(body)

    consumer = Sink(settings=settings, runtime=ConsumerSettings(
        health_file=sys.argv[1], wait_time_seconds=1, shutdown_timeout=10))
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while len(Sink.handled) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # deletes go out in batches
    consumer.request_shutdown()
    thread.join(30)
    attributes = factory.client("sqs").get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]

    # And the other way: messenger offloads a large message (above SQS's 1 MiB, its default
    # threshold on a queue), AWS's client reads it back
    big = {"from": "messenger", "pad": "y" * 1_100_000}
    producer.push(big)
    got = aws_sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=1,
                                  WaitTimeSeconds=2, MessageAttributeNames=["All"])
    read_back = json.loads(got["Messages"][0]["Body"]) if got.get("Messages") else None
    print(json.dumps({
        "handled": [[b.get("legacy"), len(b.get("pad", "")), n] for b, n in Sink.handled],
        "bad_events": Sink.bad,
        "left": int(attributes["ApproximateNumberOfMessages"])
                + int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        "read_back": read_back == big,
    }))
''')


@pytest.mark.timeout(120)
def test_aws_extended_client_messages_reach_a_consumer_in_a_patched_process(
    settings, tmp_path
):
    env = {**os.environ, "MESSENGER_NAMESPACE": settings.namespace}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "health.json")],
        capture_output=True, text=True, env=env, timeout=110,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # Then both pointer formats were resolved to their 300 KB bodies, each handled once
    handled = sorted(report["handled"], key=lambda h: str(h[0]))
    assert handled == [[False, 300_000, 1], [None, 0, 1], [True, 300_000, 1]], handled
    # And every delete went through with messenger's own (unpatched) clients: nothing left
    assert report["bad_events"] == [], result.stderr[-3000:]
    assert report["left"] == 0
    # And a message messenger offloaded reads back through AWS's client
    assert report["read_back"] is True
