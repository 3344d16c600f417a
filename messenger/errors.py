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


class JobFailed(MessengerError):
    """`Producer.result` of a job that reached a final outcome other than completed: it was
    dead-lettered, cancelled, deleted from its DLQ by an operator, or expired.

    job_id: the job. outcome: 'dead_lettered', 'cancelled', 'deleted' or 'expired'.
    error_type / error: the handler's exception class and message where a handler failed
    ('' otherwise). reason: the dead-letter or cancel reason, as the status timeline shows it."""

    def __init__(self, job_id: str, outcome: str, reason: str = "", error_type: str = "",
                 error: str = "") -> None:
        self.job_id = job_id
        self.outcome = outcome
        self.reason = reason
        self.error_type = error_type
        self.error = error
        what = f"{error_type}: {error}" if error_type else (error or reason)
        super().__init__(f"job {job_id} {outcome.replace('_', ' ')}: {what or '(no reason)'}")


class RateLimited(MessengerError):
    """Raised by a handler when an upstream answered 429 (or any 'slow down'): the message is
    not failed. It goes back to its queue, visible again after `retry_after` seconds, without
    using one of its attempts and without moving toward the DLQ (docs/flow-control.md).

    retry_after: seconds to wait, 0-43,200 (SQS's largest visibility timeout; default 1)."""

    def __init__(self, retry_after: float = 1.0, message: str = "") -> None:
        if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)) \
                or not 0 <= retry_after <= 43_200:
            raise ValueError(f"retry_after must be a number of seconds from 0 to 43200, "
                             f"got {retry_after!r}")
        self.retry_after = float(retry_after)
        super().__init__(message or f"rate limited: retry after {retry_after:g} s")
