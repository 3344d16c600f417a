"""Invoke an ops Lambda handler locally, as the Lambda runtime would: `python -m
examples.invoke_lambda queue_alarm '{"scope": "source"}'`. Prints the handler's result as JSON.

`python -m examples.invoke_lambda consumer package.module:Class` runs the consumer function
(lambdas/consumer) on one batch of the class's queue, as Lambda's SQS event source would: the
messages are received, handed over as the event, and those the response does not list as
failures are deleted. Prints the batch size and the response.

The environment carries the Lambda's settings (SLACK_WEBHOOK_SECRET, MESSENGER_NAMESPACE, ...) and
AWS_ENDPOINT_URL, so the handler talks to the local endpoint exactly as it talks to AWS.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import uuid

os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "messenger-ops")
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "messenger-local")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

FUNCTIONS = ("queue_alarm", "resource_cleaner")


class LocalContext:
    """The LambdaContext attributes Powertools reads."""

    def __init__(self, name: str) -> None:
        self.function_name = f"messenger-{name}"
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{name}"
        self.memory_limit_in_mb = 256
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "local"

    def get_remaining_time_in_millis(self) -> int:
        return 300_000


def invoke_consumer(target: str) -> dict:
    """One batch of the consumer class `target` through the consumer function."""
    from lambdas.consumer import handler
    from messenger.aws import ClientFactory
    from messenger.consume.consumer import load_consumer
    from messenger.consume.lambda_runtime import CONSUMER_VARIABLE, LocalEventSource
    from messenger.settings import Settings

    os.environ[CONSUMER_VARIABLE] = target
    settings = Settings.from_env()
    spec = load_consumer(target).channel_spec(settings.namespace)
    sqs = ClientFactory(settings.region).client("sqs")
    source = LocalEventSource(sqs, sqs.get_queue_url(QueueName=spec.queue_name)["QueueUrl"],
                              settings.region, visibility=spec.visibility_timeout)
    messages = source.receive()
    response = source.invoke(handler.handler, messages, LocalContext("consumer")) \
        if messages else {"batchItemFailures": []}
    return {"received": len(messages), "response": response}


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "consumer":
        print(json.dumps(invoke_consumer(argv[1]), default=str))
        return 0
    if len(argv) != 2 or argv[0] not in FUNCTIONS:
        print(f"usage: invoke_lambda {{{','.join(FUNCTIONS)}}} EVENT_JSON | "
              f"invoke_lambda consumer package.module:Class", file=sys.stderr)
        return 2
    module = importlib.import_module(f"lambdas.{argv[0]}.handler")
    result = module.handler(json.loads(argv[1]), LocalContext(argv[0]))
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
