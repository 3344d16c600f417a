"""Queue alarm Lambda: posts to Slack the platform queues deeper than their alarm threshold.

Schedules: `{"scope": "source"}` every 15 minutes, `{"scope": "dlq"}` every 12 hours.
Environment: SLACK_WEBHOOK_SECRET, MESSENGER_NAMESPACE, MESSENGER_ALARM_THRESHOLD,
POWERTOOLS_SERVICE_NAME (see messenger.ops.settings). The work is messenger.ops.queue_alarm.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from messenger.ops.queue_alarm import run_queue_alarm
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

    outcome = run_queue_alarm(
        event, ops.clients, ops.settings, ops.notifier(remaining),
        remaining=remaining, log=logger,
    )
    record_counts(metrics, outcome.metrics())
    logger.info("queue alarm done", extra={**outcome.summary(), "report": outcome.report_log()})
    outcome.raise_for_failure()  # stopped early or report not delivered: the invocation fails
    return outcome.summary()
