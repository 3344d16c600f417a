"""messenger: channels on SQS, SNS and S3; producers, consumers and tools.

The package is layered; imports run one way (tools → consume / produce → jobs → core):

- core (`messenger.*`): `channel`, `message`, `settings`, `errors`, `aws`, `offload`, `provision`.
- `messenger.jobs`: opt-in job-queue features: priority levels, the status store.
- `messenger.produce`: `Producer`, `MultiProducer`, batch push, transports.
- `messenger.consume`: `Consumer` and its runtime (workers, watchdog, mailbox, lifecycle, health).
- `messenger.ops`: the operations Lambdas' logic: queue alarm, resource cleaner, reports.
- `messenger.tools`: the `messenger` command: local endpoint, requeue, top, status, emr.
- `messenger.spark`: publishing a DataFrame's rows from Spark executors.

The public API below is importable from `messenger`. The producing and consuming sides are loaded
on first use, so that `from messenger import Producer` (a Spark executor, a Lambda) never loads the
consumer runtime (threads, `filelock`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from messenger.channel import ChannelSpec, ChannelTags, MessageFilter
from messenger.errors import (
    ChannelNotFound,
    InvalidBody,
    InvalidChannelSpec,
    InvalidMessage,
    InvalidSettings,
    JobFailed,
    MessageDecodeError,
    MessengerError,
    PayloadMissing,
    PayloadTooLarge,
    ProvisioningError,
    PublishFailed,
    QueueCallFailed,
    RateLimited,
    RetryBudgetExhausted,
    Unrecoverable,
)
from messenger.message import Message, ResultOmitted
from messenger.settings import Settings

if TYPE_CHECKING:  # the lazily loaded names, for type checkers and editors
    from messenger.consume.consumer import Consumer, ConsumerSettings, ReceivedMessage
    from messenger.consume.lifecycle import ConsumerState, LifecycleHooks, register_hook
    from messenger.produce.producer import MultiProducer, Producer, PushItem, PushManyResult

#: Public name → the module that defines it, imported on first access (PEP 562).
_LAZY = {
    "Consumer": "messenger.consume.consumer",
    "ConsumerSettings": "messenger.consume.consumer",
    "ReceivedMessage": "messenger.consume.consumer",
    "ConsumerState": "messenger.consume.lifecycle",
    "LifecycleHooks": "messenger.consume.lifecycle",
    "register_hook": "messenger.consume.lifecycle",
    "MultiProducer": "messenger.produce.producer",
    "Producer": "messenger.produce.producer",
    "PushItem": "messenger.produce.producer",
    "PushManyResult": "messenger.produce.producer",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'messenger' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ChannelNotFound",
    "ChannelSpec",
    "ChannelTags",
    "Consumer",
    "ConsumerSettings",
    "ConsumerState",
    "InvalidBody",
    "InvalidChannelSpec",
    "InvalidMessage",
    "InvalidSettings",
    "JobFailed",
    "LifecycleHooks",
    "Message",
    "MessageDecodeError",
    "MessageFilter",
    "MessengerError",
    "MultiProducer",
    "PayloadMissing",
    "PayloadTooLarge",
    "Producer",
    "ProvisioningError",
    "PublishFailed",
    "PushItem",
    "PushManyResult",
    "QueueCallFailed",
    "RateLimited",
    "ReceivedMessage",
    "ResultOmitted",
    "RetryBudgetExhausted",
    "Settings",
    "Unrecoverable",
    "register_hook",
]
