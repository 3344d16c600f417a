"""The function behind an `HttpEnqueue` API (stacks/http_enqueue.py): answers API Gateway's REST
proxy events with `messenger.api.app.JobApi`, the same code `messenger api` serves locally.

Environment: MESSENGER_API_CHANNELS (the channels, JSON), MESSENGER_NAMESPACE,
MESSENGER_PROVISIONING=verify, MESSENGER_KMS_KEY, MESSENGER_OFFLOAD_BUCKET,
MESSENGER_RETRY_BUDGET, MESSENGER_API_IDEMPOTENCY_WINDOW, POWERTOOLS_SERVICE_NAME.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from messenger.api.app import JobApi

logger = Logger()


@cache
def api() -> JobApi:
    """The API, its channels and producers made once per execution environment."""
    return JobApi.from_env()


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return api().handle(event, context)
