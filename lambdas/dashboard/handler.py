"""The function behind the dashboard's load balancer (stacks/dashboard_service.py): answers the
ALB's events with the same Starlette app `messenger dashboard` serves locally, through mangum.
Every request's signed identity header is verified by the app (`messenger.tools.dashboard.auth`).

Environment: see `messenger.tools.dashboard.deployed` (MESSENGER_DASHBOARD_*), plus
MESSENGER_NAMESPACE, MESSENGER_PROVISIONING=verify, POWERTOOLS_SERVICE_NAME.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from mangum import Mangum

from messenger.tools.dashboard.deployed import deployed_app

logger = Logger()


@cache
def adapter() -> Mangum:
    """The app and its clients, made once per execution environment."""
    return Mangum(deployed_app(), lifespan="off")


@logger.inject_lambda_context(correlation_id_path=correlation_paths.APPLICATION_LOAD_BALANCER)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return dict(adapter()(event, context))
