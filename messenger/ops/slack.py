"""Posting reports to a Slack incoming webhook with slack_sdk's WebhookClient and its retries.

The webhook URL is read lazily from a provider (the Lambdas read it from Secrets Manager with
Powertools Parameters). A 500/503, a 429 or a broken connection is retried by slack_sdk's retry
handlers; if the post still fails, the failure is logged and `post` returns False: a report that
cannot be delivered never crashes the run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from slack_sdk.http_retry import (
    BackoffRetryIntervalCalculator,
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    RetryHandler,
    RetryIntervalCalculator,
)
from slack_sdk.http_retry.builtin_handlers import ServerErrorRetryHandler
from slack_sdk.webhook import WebhookClient

from messenger.errors import InvalidSettings

#: Retries after the first attempt, for each kind of failure.
MAX_RETRIES = 2
TIMEOUT_SECONDS = 10


def webhook_url_from_secret(value: str | dict[str, Any], secret_name: str) -> str:
    """The URL in a secret's value: the URL itself, or JSON {"url": ...}."""
    if isinstance(value, str) and value.strip().startswith("{"):
        value = json.loads(value)
    url = value.get("url", "") if isinstance(value, dict) else value.strip()
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise InvalidSettings(
            f"secret {secret_name!r} (SLACK_WEBHOOK_SECRET) must hold the webhook URL "
            f"(https://...) or JSON {{\"url\": \"https://...\"}}"
        )
    return url


class SlackNotifier:
    """Posts Block Kit messages to the webhook whose URL `url_provider` returns.

    logger: where failures are logged (a Powertools Logger in the Lambdas).
    retry_interval: slack_sdk interval calculator (default: exponential backoff with jitter).
    timeout: seconds one HTTP attempt may take (default 10; each post tries 1 + MAX_RETRIES times).
    """

    def __init__(
        self,
        url_provider: Callable[[], str],
        logger: Any = None,
        retry_interval: RetryIntervalCalculator | None = None,
        timeout: int = TIMEOUT_SECONDS,
    ) -> None:
        self._url_provider = url_provider
        self._logger = logger or logging.getLogger(__name__)
        self._interval = retry_interval or BackoffRetryIntervalCalculator(backoff_factor=0.5)
        self._client: WebhookClient | None = None
        self._timeout = timeout

    def prepare(self) -> None:
        if self._client is None:
            handlers: list[RetryHandler] = [
                handler(max_retry_count=MAX_RETRIES, interval_calculator=self._interval)
                for handler in (
                    ServerErrorRetryHandler, RateLimitErrorRetryHandler,
                    ConnectionErrorRetryHandler,
                )
            ]
            self._client = WebhookClient(
                self._url_provider(), timeout=self._timeout, retry_handlers=handlers
            )

    def post(self, message: dict[str, Any]) -> bool:
        self.prepare()
        assert self._client is not None
        try:
            response = self._client.send_dict(message)
        except Exception as error:  # slack_sdk raises URLError & co. once retries are spent
            self._logger.error("Slack webhook post failed", extra={"error": repr(error)})
            return False
        if response.status_code != 200:
            self._logger.error(
                "Slack webhook post failed",
                extra={"status": response.status_code, "body": response.body[:500]},
            )
            return False
        return True
