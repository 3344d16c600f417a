"""messenger: channels on SQS, SNS and S3; producers, consumers and tools."""

from messenger.channel import ChannelSpec, ChannelTags, MessageFilter
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
from messenger.message import Message
from messenger.producer import MultiProducer, Producer, PushItem, PushManyResult
from messenger.settings import Settings

__all__ = [
    "ChannelNotFound",
    "ChannelSpec",
    "ChannelTags",
    "InvalidChannelSpec",
    "InvalidMessage",
    "InvalidSettings",
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
    "Settings",
]
