"""Posting reports to a Slack incoming webhook with slack_sdk's WebhookClient, within the time
the Lambda has left.

The webhook URL is read lazily from a provider (the Lambdas read it from Secrets Manager with
Powertools Parameters). A 500/502/503/504, a 429 (after its Retry-After), a broken or a hung
connection (an attempt that times out) is retried, up to MAX_RETRIES times, through slack_sdk's
retry-handler interface, but only while the invocation has time for the wait plus one more
attempt (`remaining`, the Lambda context's remaining time): no sleep or attempt ever runs past
it, less `reserve` seconds kept to log and flush metrics. A post that still fails is logged
with the whole message and `post` returns False: the caller fails the run after reporting.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from http.client import RemoteDisconnected
from typing import Any
from urllib.error import URLError

from slack_sdk.http_retry import (
    BackoffRetryIntervalCalculator,
    RetryHandler,
    RetryIntervalCalculator,
)
from slack_sdk.webhook import WebhookClient

from messenger.errors import InvalidSettings

#: Retries after the first attempt.
MAX_RETRIES = 2
TIMEOUT_SECONDS = 10
#: Seconds of the Lambda's time no post may use: to log the report and flush the metrics.
RESERVE_SECONDS = 5.0
#: The shortest attempt worth starting (a webhook answers in well under a second).
MIN_ATTEMPT_SECONDS = 1.0
RETRIED_STATUSES = (429, 500, 502, 503, 504)
CONNECTION_ERRORS = (URLError, ConnectionError, RemoteDisconnected, TimeoutError)


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


class _RetryWithinTime(RetryHandler):
    """slack_sdk retry handler for 5xx, 429 and connection errors and timeouts, which retries
    only when the wait and one more attempt fit in the notifier's time left."""

    def __init__(self, notifier: SlackNotifier, interval: RetryIntervalCalculator) -> None:
        super().__init__(max_retry_count=MAX_RETRIES, interval_calculator=interval)
        self._notifier = notifier
        self._wait = 0.0

    def _can_retry(self, *, state: Any, request: Any, response: Any = None,
                   error: Exception | None = None) -> bool:
        if response is not None:
            if response.status_code not in RETRIED_STATUSES:
                return False
            wait = (_retry_after(response) if response.status_code == 429
                    else self.interval_calculator.calculate_sleep_duration(state.current_attempt))
        elif isinstance(error, CONNECTION_ERRORS):
            wait = self.interval_calculator.calculate_sleep_duration(state.current_attempt)
        else:
            return False
        left = self._notifier.time_left()
        if left is not None and wait + MIN_ATTEMPT_SECONDS > left:
            self._notifier.log.warning(
                "Slack post not retried: the Lambda's time would run out",
                extra={"wait_seconds": round(wait, 1), "seconds_left": round(left, 1),
                       "status": getattr(response, "status_code", None),
                       "error": repr(error)})
            return False
        self._wait = wait
        return True

    def prepare_for_next_attempt(self, *, state: Any, request: Any, response: Any = None,
                                 error: Exception | None = None) -> None:
        state.next_attempt_requested = True
        time.sleep(self._wait)
        self._notifier.fit_timeout()
        state.increment_current_attempt()


def _retry_after(response: Any) -> float:
    """Seconds a 429 asks to wait (its Retry-After; 1 when absent), plus up to 1 s of jitter."""
    values = {k.lower(): v for k, v in response.headers.items()}.get("retry-after") or ["1"]
    value = values[0] if isinstance(values, list) else values
    try:
        seconds = float(value)
    except ValueError:
        seconds = 1.0
    return seconds + random.random()


class SlackNotifier:
    """Posts Block Kit messages to the webhook whose URL `url_provider` returns.

    logger: where failures are logged, each with the whole message (a Powertools Logger in the
    Lambdas). retry_interval: slack_sdk interval calculator (default: exponential backoff with
    jitter, 0.5 s first). timeout: seconds one HTTP attempt may take (default 10, less when the
    Lambda has less left). remaining: seconds the invocation has left (None: no limit).
    reserve: seconds of those no post may use (default 5).
    """

    def __init__(
        self,
        url_provider: Callable[[], str],
        logger: Any = None,
        retry_interval: RetryIntervalCalculator | None = None,
        timeout: float = TIMEOUT_SECONDS,
        remaining: Callable[[], float] | None = None,
        reserve: float = RESERVE_SECONDS,
    ) -> None:
        self._url_provider = url_provider
        self.log = logger or logging.getLogger(__name__)
        self._interval = retry_interval or BackoffRetryIntervalCalculator(backoff_factor=0.5)
        self._client: WebhookClient | None = None
        self._timeout = timeout
        self._remaining = remaining
        self._reserve = reserve

    def time_left(self) -> float | None:
        """Seconds a post may still use (None: no limit)."""
        return None if self._remaining is None else self._remaining() - self._reserve

    def fit_timeout(self) -> None:
        """The next attempt ends before the time left does."""
        left = self.time_left()
        assert self._client is not None
        # urllib takes a float timeout, whatever WebhookClient's annotation says
        self._client.timeout = (self._timeout if left is None  # type: ignore[assignment]
                                else max(min(self._timeout, left), 0.1))

    def prepare(self) -> None:
        if self._client is None:
            self._client = WebhookClient(
                self._url_provider(), timeout=int(self._timeout),
                retry_handlers=[_RetryWithinTime(self, self._interval)],
            )

    def post(self, message: dict[str, Any]) -> bool:
        self.prepare()
        assert self._client is not None
        left = self.time_left()
        if left is not None and left < MIN_ATTEMPT_SECONDS:
            return self._failed(message, status=None, error="no time left to post")
        self.fit_timeout()
        try:
            response = self._client.send_dict(message)
        except Exception as error:  # slack_sdk raises URLError & co. once retries are spent
            return self._failed(message, status=None, error=repr(error))
        if response.status_code != 200:
            return self._failed(message, status=response.status_code, error=response.body[:500])
        return True

    def _failed(self, message: dict[str, Any], status: int | None, error: str) -> bool:
        self.log.error("Slack webhook post failed", extra={
            "status": status, "error": error, "undelivered": json.dumps(message,
                                                                         ensure_ascii=False)})
        return False
