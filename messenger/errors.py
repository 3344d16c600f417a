"""The messenger error hierarchy: every failure a caller can act on has its own class."""

from __future__ import annotations


class MessengerError(Exception):
    """Base class of every error raised by messenger."""


class InvalidChannelSpec(MessengerError, ValueError):
    """A channel description (name, filter, delay, ...) is not valid."""


class InvalidSettings(MessengerError, ValueError):
    """A setting read from the environment or passed in code is not valid."""


class ChannelNotFound(MessengerError):
    """A queue, topic or subscription a channel needs does not exist (verify mode)."""


class InvalidMessage(MessengerError, ValueError):
    """A message body cannot be encoded (e.g. not JSON-serializable)."""


class MessageDecodeError(MessengerError):
    """A received message cannot be decoded into a `Message`."""


class InvalidBody(InvalidMessage, MessageDecodeError):
    """A body does not validate against its declared model: 'invalid: <field>: <error>'."""


class PayloadTooLarge(MessengerError, ValueError):
    """A message is larger than the largest payload the channel can carry, even offloaded."""


class PayloadMissing(MessengerError):
    """An offloaded payload pointed to by a message is not in the bucket any more."""


class RetryBudgetExhausted(MessengerError):
    """A call to AWS kept failing transiently (throttling, 5xx, a dropped connection) until
    its retry budget was spent; the subclass says which side's call it was."""


class PublishFailed(RetryBudgetExhausted):
    """A push could not be completed within the retry budget."""


class QueueCallFailed(RetryBudgetExhausted):
    """A consumer's call on its queue or DLQ (delete, forward to the DLQ, visibility change)
    could not be completed within the retry budget; the message names the call."""


class ProvisioningError(MessengerError):
    """Infrastructure for a channel could not be created or checked."""


class DeadLetterNotFound(MessengerError):
    """A dead letter asked for by id is not in the channel's DLQ (or could not be seen)."""


class Unrecoverable(MessengerError):
    """Raised by a handler: this message's failure is final. The consumer dead-letters it at
    once, without its remaining attempts, with the reason 'unrecoverable: <type>: <message>'
    (a consumer's `final_errors` makes other exception classes final too)."""
