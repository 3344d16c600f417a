"""messenger: channels on SQS, SNS and S3; producers, consumers and tools."""

from messenger.channel import ChannelSpec, ChannelTags, MessageFilter
from messenger.consumer import Consumer, ConsumerSettings, ReceivedMessage
from messenger.errors import (
    ChannelNotFound,
    InvalidChannelSpec,
    InvalidMessage,
    InvalidSettings,
    MessageDecodeError,
    MessengerError,
    PayloadMissing,
    PayloadTooLarge,
    ProvisioningError,
    PublishFailed,
)
from messenger.lifecycle import ConsumerState, LifecycleHooks, register_hook
from messenger.message import Message
from messenger.producer import MultiProducer, Producer, PushItem, PushManyResult
from messenger.settings import Settings

__all__ = [
    "ChannelNotFound",
    "ChannelSpec",
    "ChannelTags",
    "Consumer",
    "ConsumerSettings",
    "ConsumerState",
    "InvalidChannelSpec",
    "InvalidMessage",
    "InvalidSettings",
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
    "ReceivedMessage",
    "Settings",
    "register_hook",
]
