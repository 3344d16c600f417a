"""The function of a `LambdaConsumer` (stacks/lambda_consumer.py): runs a team's `Consumer` class
on each SQS batch its event source delivers, with partial batch failures.

Environment: MESSENGER_CONSUMER ('package.module:Class', the class the Fargate image runs with
`messenger consume`), MESSENGER_NAMESPACE, MESSENGER_PROVISIONING=verify, MESSENGER_KMS_KEY,
MESSENGER_OFFLOAD_BUCKET. The work is `messenger.consume.lambda_runtime`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from messenger.consume.lambda_runtime import LambdaConsumerRuntime


@cache
def runtime() -> LambdaConsumerRuntime:
    """The consumer and its resolved channel, made once per execution environment (a failure,
    such as a missing queue, fails the invocation and is tried again at the next)."""
    return LambdaConsumerRuntime.from_env()


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return dict(runtime().handle(event, context))
