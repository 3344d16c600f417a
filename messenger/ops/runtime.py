"""What an ops Lambda handler needs, made once per execution environment.

Settings are read once from the environment; boto3 clients come lazily from a `ClientFactory`
(no region or endpoint fixed at import); the webhook URL is read from Secrets Manager through
Powertools Parameters (cached 5 minutes, so a rotated URL is picked up by warm functions).
Imports aws_lambda_powertools when used: the Lambdas get it from the Powertools layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from messenger.aws import ClientFactory
from messenger.ops.settings import OpsSettings
from messenger.ops.slack import SlackNotifier, webhook_url_from_secret

SECRET_MAX_AGE_SECONDS = 300


@dataclass
class OpsRuntime:
    """Settings, clients and the secret provider of one Lambda execution environment."""

    settings: OpsSettings
    clients: ClientFactory
    logger: Any = None
    _secrets: Any = field(default=None, repr=False)

    @classmethod
    def from_env(cls, logger: Any = None) -> OpsRuntime:
        settings = OpsSettings.from_env()
        return cls(settings, ClientFactory(settings.region), logger)

    def webhook_url(self) -> str:
        if self._secrets is None:
            from aws_lambda_powertools.utilities.parameters import SecretsProvider

            self._secrets = SecretsProvider(boto3_client=self.clients.client("secretsmanager"))
        name = self.settings.slack_webhook_secret
        return webhook_url_from_secret(
            self._secrets.get(name, max_age=SECRET_MAX_AGE_SECONDS), name
        )

    def notifier(self, remaining: Callable[[], float] | None = None) -> SlackNotifier:
        """A Slack notifier for one invocation (reads the webhook URL at first use); its posts
        and retries end before `remaining` (seconds the invocation has left) runs out."""
        return SlackNotifier(self.webhook_url, self.logger, remaining=remaining)


def record_counts(metrics: Any, counts: Mapping[str, int]) -> None:
    """Add each count to a Powertools `Metrics` (flushed by its `log_metrics` decorator)."""
    from aws_lambda_powertools.metrics import MetricUnit

    for name, value in counts.items():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
