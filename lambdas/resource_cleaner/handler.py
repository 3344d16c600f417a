"""Resource cleaner Lambda (daily, event `{}`): deletes unused platform topics and queues,
reports stale queues and queues without producers or consumers to Slack.

Environment: SLACK_WEBHOOK_SECRET, MESSENGER_NAMESPACE, CLEANER_DRY_RUN ('true'/'false'),
POWERTOOLS_SERVICE_NAME (see messenger.ops.settings). The work is messenger.ops.cleaner.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from messenger.ops.cleaner import run_resource_cleaner
from messenger.ops.runtime import OpsRuntime, record_counts

logger = Logger()
metrics = Metrics()
tracer = Tracer()


@cache
def runtime() -> OpsRuntime:
    """Settings, clients and the Slack webhook URL, read and checked once per execution
    environment: a missing or malformed secret fails every invocation at once, whether or not
    there is anything to report (then the function's Errors alarm tells the operator)."""
    ops = OpsRuntime.from_env(logger)
    ops.webhook_url()
    return ops


@logger.inject_lambda_context(log_event=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    ops = runtime()

    def remaining() -> float:
        return context.get_remaining_time_in_millis() / 1000

    outcome = run_resource_cleaner(
        ops.clients, ops.settings, ops.notifier(remaining),
        remaining=remaining, log=logger,
    )
    record_counts(metrics, outcome.metrics())
    logger.info("resource cleaner done", extra=outcome.summary())
    outcome.raise_for_failure()  # stopped early or report not delivered: the invocation fails
    return outcome.summary()
