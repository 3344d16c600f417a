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
    """Settings and clients, made once per execution environment."""
    return OpsRuntime.from_env(logger)


@logger.inject_lambda_context(log_event=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    ops = runtime()
    outcome = run_resource_cleaner(ops.clients, ops.settings, ops.notifier())
    record_counts(metrics, outcome.metrics())
    logger.info("resource cleaner done", extra=outcome.summary())
    return outcome.summary()
