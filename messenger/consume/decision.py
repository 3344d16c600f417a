"""The outcome decision: what to do with a message, decided from facts alone (no AWS, no
threads, no clock of its own), for the Fargate runtime and the Lambda runtime.

`messenger.consume.outcome.OutcomePolicy` gathers the facts (the delivery, the handler's result
or exception, the consumer's settings, a clock value), asks here, and carries the `Verdict` out;
the runtimes keep transport and threading. dramatiq's `Retries` middleware is the model: one
pure decision from (message, exception, options), tested without a broker
(tests/unit/test_outcome_decision.py).

- `on_receive`: before anything runs: the invocation's time is up → RELEASE ('out_of_time',
  never dead-lettered: it runs in another invocation); SQS's receive count past the message's
  attempts (a consumer stopped during its last attempt) → DEAD_LETTER ('attempts_exhausted');
  else RUN.
- `on_unreadable`: a body that can never be read → DEAD_LETTER at once with its reason.
- `on_result`: the handler returned → COMPLETE; it raised `messenger.Unrecoverable` or one of
  the consumer's `final_errors` → DEAD_LETTER at once ('unrecoverable: <type>: <message>');
  its last attempt failed → DEAD_LETTER ('failed: attempts used up (n of m)'); else RETRY after
  the backoff delay, capped within SQS's 12 hours in flight.
- `on_deadline`: a running message's deadline: not yet → RUN; an operator cancelled it →
  DEAD_LETTER ('cancelled by <who>'); the invocation's end came first (Lambda) → RELEASE
  ('out_of_time', not dead-lettered); else its processing timeout → DEAD_LETTER.
- `on_forward_failed`: a dead-letter forward failed: a failed handler's message is KEPT (back
  when its lease ends, or SQS's redrive moves it); one dead-lettered for another reason (no DLQ
  to take an unreadable or timed-out message) stops a long-running consumer (STOP_CONSUMER,
  Fargate: ECS replaces the task), and is KEPT where there is no consumer to stop (Lambda).
- `on_limited`: a job held back by a limit (`messenger.consume.limits`) or by its handler's
  `messenger.RateLimited`: RUN (wait in the consumer, its lease kept: a short wait, or any on
  an ordered channel within the time it has) or HOLD (back in its queue after a delay, as a new
  message carrying the attempts it used: no attempt used, no step toward the DLQ).
- `after_step`: in an ordered group, a message not finished for good holds back the rest of
  the group (RELEASE_REST 'group_blocked': SQS hands them out again in order); else RUN.
- `deadline`: when a message's run ends: its processing timeout, never past the limit (Lambda:
  the invocation's end).
"""

from __future__ import annotations

import enum
import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from messenger.consume.failures import (
    MAX_ERROR_MESSAGE_LENGTH,
    MAX_RETRY_DELAY_SECONDS,
    RetryPolicy,
    exhausted_reason,
)
from messenger.errors import RateLimited, Unrecoverable

if TYPE_CHECKING:
    from messenger.consume.host import RuntimeHost

#: Release reasons (the 'released' event's `reason`).
OUT_OF_TIME = "out_of_time"
GROUP_BLOCKED = "group_blocked"
#: Hold reasons (the 'held' event's `reason`): a limit's, a handler's RateLimited.
LIMITED = "limited"
RATE_LIMITED = "rate_limited"
#: A job held back waits in its consumer (its lease kept) at most this long; longer, it goes
#: back in its queue with a delay (a new message: SQS's receive count starts again).
WAIT_IN_CONSUMER_SECONDS = 1.0
#: The same for a wait on a tenant's limit (the tenant's other jobs would fill the workers).
TENANT_WAIT_SECONDS = 0.25
#: A job held back again and again is delayed up to 2**holds seconds more (jitter), at most
#: this much more: a tenant's backlog spreads out instead of coming back all at once.
MAX_HOLD_SPREAD_SECONDS = 120
#: SQS's longest DelaySeconds: a longer hold is sent with it, and held again when it arrives
#: early (its held-until mark).
MAX_HOLD_DELAY_SECONDS = 900

#: Characters SQS refuses in a message attribute's value (its allowed set is #x9 #xA #xD,
#: #x20-#xD7FF, #xE000-#xFFFD, #x10000-#x10FFFF): replaced in a reason.
_REFUSED_BY_SQS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


class Action(enum.Enum):
    """What a verdict tells the runtime to do with the message."""

    RUN = "run"  # nothing decided: go on (run the handler; the next message of the group)
    COMPLETE = "complete"  # handled: delete it
    RETRY = "retry"  # visible again after `delay` seconds
    DEAD_LETTER = "dead_letter"  # to the DLQ with `reason`, then deleted
    RELEASE = "release"  # visible again at once, not dead-lettered (`reason`)
    RELEASE_REST = "release_rest"  # the rest of its ordered group visible again (`reason`)
    HOLD = "hold"  # held back by a limit: not a failure, no attempt used (`delay`, `reason`)
    KEEP = "keep"  # left in its queue: back when its lease ends
    STOP_CONSUMER = "stop_consumer"  # left in its queue, and the consumer stops (`reason`)


@dataclass(frozen=True)
class Verdict:
    """One decision: the action, and its reason or delay where it has one.

    final: dead-lettered before its attempts were used up because its failure is final
    (`Unrecoverable`, `final_errors`)."""

    action: Action
    reason: str = ""
    delay: int = 0
    final: bool = False


#: The verdict that decides nothing (go on).
RUN = Verdict(Action.RUN)


@dataclass(frozen=True)
class Facts:
    """What is known of one delivery.

    receive_count: the current attempt (SQS's ApproximateReceiveCount, plus the attempts of
    the copies before it when it was held back by a limit: `Delivery.attempt`). attributes: the
    message's attributes (its headers: the producer's max_attempts among them). held_seconds:
    how long it has been in flight since SQS can have handed it out (its 12 hours count from
    there). cancelled_by: who cancelled it while it ran (None: nobody). hold_left: seconds it
    is still held back (a RateLimited delay longer than SQS's largest DelaySeconds)."""

    receive_count: int
    attributes: Mapping[str, Mapping[str, Any]]
    held_seconds: float = 0.0
    cancelled_by: str | None = None
    hold_left: float = 0.0


@dataclass(frozen=True)
class Rules:
    """The consumer's settings the decision reads.

    retry: attempts and delays. processing_timeout: seconds a handler may run. final_errors:
    exception classes whose failure is final (besides `Unrecoverable`). can_stop: a consumer
    that can stop when a dead letter cannot be forwarded (Fargate; Lambda has none to stop)."""

    retry: RetryPolicy
    processing_timeout: float
    final_errors: tuple[type[BaseException], ...] = ()
    can_stop: bool = True

    @classmethod
    def of(cls, consumer: RuntimeHost, can_stop: bool = True) -> Rules:
        return cls(consumer.retry_policy, float(consumer.processing_timeout),
                   tuple(consumer.final_errors), can_stop)

    def attempts(self, facts: Facts) -> int:
        """How many attempts the message gets (`RetryPolicy.attempts`)."""
        return self.retry.attempts(facts.attributes)


def deadline(started_at: float, processing_timeout: float, limit: float | None = None) -> float:
    """When a run that started at `started_at` times out: its processing timeout, never past
    `limit` (Lambda: the invocation's end; None: none)."""
    timeout_at = started_at + processing_timeout
    return timeout_at if limit is None else min(timeout_at, limit)


def stopped_reason(receive_count: int, attempts: int) -> str:
    """The dead-letter reason of a message received after its attempts were used up.

    It names the receive count, not an attempt: a receive that never ran the handler (a long
    poll still in flight when its process died takes the message all the same) counts too, so
    which attempt was interrupted is not known."""
    allowed = "1 attempt" if attempts == 1 else f"{attempts} attempts"
    return (f"attempts_exhausted: received {receive_count} times, {allowed} allowed "
            f"(a consumer stopped during its last attempt)")


def timeout_reason(processing_timeout: float) -> str:
    return f"processing_timeout: exceeded {processing_timeout:g} s"


def cancelled_reason(by: str) -> str:
    """The dead-letter reason of a running job an operator cancelled (`messenger cancel`)."""
    return f"cancelled by {by}"


def unrecoverable_reason(error: BaseException) -> str:
    """'unrecoverable: <type>: <message>' (the message cut at MAX_ERROR_MESSAGE_LENGTH, and
    characters SQS refuses in an attribute replaced by '?')."""
    message = _REFUSED_BY_SQS.sub("?", str(error)[:MAX_ERROR_MESSAGE_LENGTH]) or "(no message)"
    return f"unrecoverable: {type(error).__name__}: {message}"


def is_final(error: BaseException, rules: Rules) -> bool:
    """A failure that no retry can fix: `Unrecoverable`, or one of the consumer's
    `final_errors`."""
    return isinstance(error, Unrecoverable) or (
        bool(rules.final_errors) and isinstance(error, rules.final_errors))


def retry_delay(facts: Facts, rules: Rules, draw: Callable[[], float] = random.random) -> int:
    """Seconds a message waits after failing its current attempt: the backoff delay, capped so
    that it stays within SQS's 12 hours in flight since SQS can have handed it out."""
    delay = rules.retry.delay(facts.receive_count, draw)
    return max(0, min(delay, int(MAX_RETRY_DELAY_SECONDS - facts.held_seconds) - 1))


def on_receive(facts: Facts, rules: Rules, now: float, limit: float | None = None) -> Verdict:
    """Before a message runs: RELEASE when the invocation's time is up (`limit`: Lambda's; not
    a dead letter), HOLD while its hold lasts, DEAD_LETTER when its attempts were used up
    already, else RUN."""
    if limit is not None and now >= limit:
        return Verdict(Action.RELEASE, OUT_OF_TIME)
    if facts.hold_left >= 1:  # arrived before its hold's end (a hold longer than 900 s)
        return Verdict(Action.HOLD, RATE_LIMITED, delay=math.ceil(facts.hold_left))
    attempts = rules.attempts(facts)
    if facts.receive_count > attempts:
        return Verdict(Action.DEAD_LETTER, stopped_reason(facts.receive_count, attempts))
    return RUN


def on_unreadable(reason: str) -> Verdict:
    """A body that can never be read (undecodable, invalid, its payload gone): the DLQ at
    once, with its reason (`messenger.consume.mailbox.unreadable_reason`)."""
    return Verdict(Action.DEAD_LETTER, reason)


def on_result(facts: Facts, rules: Rules, error: BaseException | None,
              draw: Callable[[], float] = random.random) -> Verdict:
    """The handler's end: returned (`error` None) → COMPLETE; `messenger.RateLimited` → HOLD
    for its retry_after (not a failure: no attempt used); a final failure → DEAD_LETTER at
    once; its last attempt → DEAD_LETTER; else RETRY after the backoff delay."""
    if error is None:
        return Verdict(Action.COMPLETE)
    if isinstance(error, RateLimited):
        return Verdict(Action.HOLD, RATE_LIMITED, delay=math.ceil(error.retry_after))
    if is_final(error, rules):
        return Verdict(Action.DEAD_LETTER, unrecoverable_reason(error), final=True)
    attempts = rules.attempts(facts)
    if facts.receive_count >= attempts:
        return Verdict(Action.DEAD_LETTER, exhausted_reason(facts.receive_count, attempts))
    return Verdict(Action.RETRY, delay=retry_delay(facts, rules, draw))


def on_deadline(facts: Facts, rules: Rules, due: float | None, limit: float | None,
                now: float | None = None) -> Verdict:
    """A running message's deadline `due` (None: none set). now: the clock (None: the runtime
    found it due already). RUN while not due; cancelled → DEAD_LETTER 'cancelled by <who>';
    the invocation's end (`limit`) reached first → RELEASE 'out_of_time'; else DEAD_LETTER
    'processing_timeout: ...'."""
    if now is not None and due is not None and now < due:
        return RUN
    if facts.cancelled_by is not None:
        return Verdict(Action.DEAD_LETTER, cancelled_reason(facts.cancelled_by))
    if limit is not None and (due is None or due >= limit):
        return Verdict(Action.RELEASE, OUT_OF_TIME)
    return Verdict(Action.DEAD_LETTER, timeout_reason(rules.processing_timeout))


def on_forward_failed(rules: Rules, handler_failed: bool, reason: str,
                      error: BaseException, timed_out: bool = False) -> Verdict:
    """A dead-letter forward failed. KEEP a failed handler's message (back when its lease
    ends; SQS's redrive is the safety net), and any message where no consumer can stop;
    else STOP_CONSUMER: nothing takes this consumer's dead letters (its reason names why it
    was dead-lettered and the error; a timed-out message's names both)."""
    if handler_failed or not rules.can_stop:
        return Verdict(Action.KEEP, reason)
    if timed_out:
        return Verdict(Action.STOP_CONSUMER, f"{reason}; forwarding to the DLQ failed: {error}")
    return Verdict(Action.STOP_CONSUMER, f"{type(error).__name__}: {error}")


def on_limited(wait: float, room: float | None, ordered: bool, holds: int = 0,
               draw: Callable[[], float] = random.random,
               most: float = WAIT_IN_CONSUMER_SECONDS, backlog: float = 0.0) -> Verdict:
    """A job held back `wait` seconds by a limit (or its handler's RateLimited): RUN, to wait
    in the consumer (its lease kept), when the wait is at most `most` (WAIT_IN_CONSUMER_SECONDS;
    a tenant's limit: TENANT_WAIT_SECONDS, so that one tenant's jobs do not hold the workers
    the others need), or on an ordered channel (its group waits either way; re-sending it
    would put it behind the rest of its group); never past `room` (Lambda: the invocation's
    time left; None: no bound). Else HOLD: back in its queue after `hold_delay` (a new
    message, its attempts carried; `backlog`: see there)."""
    fits = room is None or wait < room
    if fits and (wait <= most or ordered):
        return RUN
    return Verdict(Action.HOLD, LIMITED, delay=hold_delay(wait, holds, draw, backlog))


def hold_delay(wait: float, holds: int, draw: Callable[[], float] = random.random,
               backlog: float = 0.0) -> int:
    """Whole seconds a job held back goes back in its queue for: its wait, plus a spread drawn
    at random: up to 2**holds seconds (at most MAX_HOLD_SPREAD_SECONDS), or up to `backlog`
    when longer (seconds the limit needs for the jobs held back on it lately: they come back
    about as fast as it lets them run, instead of all at once); at least 1, at most
    MAX_HOLD_DELAY_SECONDS beyond the wait."""
    spread = max(min(2.0 ** min(holds, 16), MAX_HOLD_SPREAD_SECONDS),
                 min(backlog, MAX_HOLD_DELAY_SECONDS))
    return max(1, math.ceil(wait + draw() * spread))


def after_step(ordered: bool, finished: bool, remaining: int) -> Verdict:
    """After one message of a chain (a poll's messages of one group): on an ordered channel a
    message not finished for good (retried, kept, timed out) holds the `remaining` ones back:
    RELEASE_REST 'group_blocked' (SQS hands the group out again in order); else RUN."""
    if ordered and not finished and remaining > 0:
        return Verdict(Action.RELEASE_REST, GROUP_BLOCKED)
    return RUN


__all__ = [
    "GROUP_BLOCKED", "LIMITED", "OUT_OF_TIME", "RATE_LIMITED", "RUN", "TENANT_WAIT_SECONDS",
    "WAIT_IN_CONSUMER_SECONDS",
    "Action", "Facts", "Rules", "Verdict", "after_step", "cancelled_reason", "deadline",
    "hold_delay", "is_final", "on_deadline", "on_forward_failed", "on_limited", "on_receive",
    "on_result", "on_unreadable", "retry_delay", "stopped_reason",
    "timeout_reason", "unrecoverable_reason",
]
