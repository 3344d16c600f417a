"""Ops Lambda fixtures: a local Slack webhook sink, the Lambda environment, metric seeding."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from types import ModuleType

import pytest

from messenger.aws import ClientFactory
from messenger.ops.runtime import OpsRuntime
from messenger.ops.settings import OpsSettings
from messenger.settings import Settings
from messenger.tools.local import LocalProcess
from messenger.tools.webhook_sink import WebhookSink

# Powertools reads these when a handler module is imported: set them before that happens.
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "messenger-tests")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "messenger-ops")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

SECRET_NAME = "messenger/slack-webhook"


@pytest.fixture
def webhook() -> Iterator[WebhookSink]:
    sink = WebhookSink()
    yield sink
    sink.close()


@dataclass
class LambdaEnv:
    settings: Settings
    ops: OpsSettings
    clients: ClientFactory


@pytest.fixture(scope="session")
def ops_clients(local_endpoint: LocalProcess) -> ClientFactory:
    """One client factory for all these tests: making boto3 clients costs ~0.2 s each."""
    return ClientFactory("us-east-1")


@pytest.fixture
def lambda_env(
    settings: Settings, ops_clients: ClientFactory, webhook: WebhookSink,
    monkeypatch: pytest.MonkeyPatch,
) -> LambdaEnv:
    """The Lambdas' environment (the CDK contract) for this test's namespace; the webhook URL
    is in a Secrets Manager secret on the moto server."""
    clients = ops_clients
    clients.client("secretsmanager").create_secret(Name=SECRET_NAME, SecretString=webhook.url)
    env = {
        "SLACK_WEBHOOK_SECRET": SECRET_NAME,
        "MESSENGER_NAMESPACE": settings.namespace,
        "MESSENGER_ALARM_THRESHOLD": "100",
        "CLEANER_DRY_RUN": "false",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return LambdaEnv(settings, OpsSettings.from_env(), clients)


def load_handler(
    name: str, env: LambdaEnv | None = None, monkeypatch: pytest.MonkeyPatch | None = None
) -> ModuleType:
    """lambdas/<name>/handler.py with its once-per-environment runtime forgotten; given `env`
    and `monkeypatch`, the runtime reuses the test's client factory (settings still from env)."""
    module = importlib.import_module(f"lambdas.{name}.handler")
    module.runtime.cache_clear()
    if env is not None and monkeypatch is not None:
        shared = OpsRuntime(OpsSettings.from_env(), env.clients, module.logger)
        monkeypatch.setattr(module, "runtime", lambda: shared)
    return module


class FakeContext:
    """The attributes of a LambdaContext that Powertools reads."""

    function_name = "ops-test"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:ops-test"
    memory_limit_in_mb = 256
    aws_request_id = "00000000-0000-0000-0000-000000000000"
    log_group_name = "/aws/lambda/ops-test"
    log_stream_name = "test"

    def __init__(self, seconds: float = 600.0) -> None:
        """A Lambda with `seconds` left from now (10 minutes: the cleaner's timeout)."""
        import time

        self._deadline = time.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        import time

        return int((self._deadline - time.monotonic()) * 1000)


def seed(
    clients: ClientFactory, namespace: str, dimension: str, name: str,
    points: dict[str, list[tuple[datetime, float]]],
) -> None:
    """put_metric_data into AWS/SQS or AWS/SNS: {metric: [(timestamp, value), ...]}."""
    data = [
        {
            "MetricName": metric,
            "Dimensions": [{"Name": dimension, "Value": name}],
            "Timestamp": at,
            "Value": value,
        }
        for metric, series in points.items()
        for at, value in series
    ]
    clients.client("cloudwatch").put_metric_data(Namespace=namespace, MetricData=data)
