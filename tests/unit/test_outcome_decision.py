"""The outcome decision (`messenger.consume.decision`) as one table: facts in, a verdict out, no
AWS endpoint, no threads, a clock value given. It covers the decisions that lived in the
runtimes (Lambda's 'out of time: release, not dead-letter', Fargate stopping when a DLQ forward
fails, the rest of an ordered group released after a failure, the deadline) and final failures
(`messenger.Unrecoverable`, `Consumer.final_errors`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from messenger import RateLimited, Unrecoverable
from messenger.consume import decision
from messenger.consume.decision import Action, Facts, Rules, Verdict
from messenger.consume.failures import MAX_RETRY_DELAY_SECONDS, RetryPolicy
from messenger.message import MAX_ATTEMPTS_ATTRIBUTE


def attempts_header(n: int | str) -> dict[str, Any]:
    return {MAX_ATTEMPTS_ATTRIBUTE: {"DataType": "Number", "StringValue": str(n)}}


#: max_receives 5, no max_attempts (5 attempts), delays 30 s doubling up to 600 s.
RULES = Rules(RetryPolicy(5, None, 30, 2.0, 600), processing_timeout=60)
#: Three attempts; KeyError and PermissionError (and their subclasses) are final.
FINAL = Rules(RetryPolicy(5, 3, 30, 2.0, 600), 60, final_errors=(KeyError, PermissionError))
#: A runtime with no consumer to stop (Lambda).
LAMBDA = Rules(RetryPolicy(5, None, 30, 2.0, 600), 60, can_stop=False)
HALF_DAY = Rules(RetryPolicy(5, None, MAX_RETRY_DELAY_SECONDS, 2.0, MAX_RETRY_DELAY_SECONDS), 60)


def top() -> float:
    return 1.0  # each delay at the top of its jitter range: exact


def bottom() -> float:
    return 0.0  # each delay at half its value


def facts(receive_count: int = 1, attributes: dict[str, Any] | None = None,
          held: float = 0.0, cancelled_by: str | None = None) -> Facts:
    return Facts(receive_count, attributes or {}, held, cancelled_by)


class Custom(Exception):
    pass


class Specific(KeyError):
    pass


Row = tuple[Callable[[], Verdict], Verdict]

TABLE: dict[str, Row] = {
    # -- before anything runs (on_receive) --
    "first receive: run": (
        lambda: decision.on_receive(facts(1), RULES, now=10.0), decision.RUN),
    "last receive allowed: run": (
        lambda: decision.on_receive(facts(5), RULES, now=10.0), decision.RUN),
    "received past its attempts (a consumer stopped): dead-lettered, not run": (
        lambda: decision.on_receive(facts(6), RULES, now=10.0),
        Verdict(Action.DEAD_LETTER, "attempts_exhausted: received 6 times, 5 attempts allowed "
                                    "(a consumer stopped during its last attempt)")),
    "the producer's max_attempts counts: received twice, 1 attempt": (
        lambda: decision.on_receive(facts(2, attempts_header(1)), RULES, now=10.0),
        Verdict(Action.DEAD_LETTER, "attempts_exhausted: received 2 times, 1 attempt allowed "
                                    "(a consumer stopped during its last attempt)")),
    "a producer's max_attempts over max_receives is capped": (
        lambda: decision.on_receive(facts(5, attempts_header(50)), RULES, now=10.0),
        decision.RUN),
    "an unreadable max_attempts header is the consumer's": (
        lambda: decision.on_receive(facts(5, attempts_header("many")), RULES, now=10.0),
        decision.RUN),
    "lambda: the invocation's time is up before it starts: released, not dead-lettered": (
        lambda: decision.on_receive(facts(9), RULES, now=100.0, limit=100.0),
        Verdict(Action.RELEASE, "out_of_time")),
    "lambda: time left: run": (
        lambda: decision.on_receive(facts(1), RULES, now=99.0, limit=100.0), decision.RUN),
    # -- unreadable --
    "an unreadable body: the DLQ at once": (
        lambda: decision.on_unreadable("undecodable: message body is not JSON"),
        Verdict(Action.DEAD_LETTER, "undecodable: message body is not JSON")),
    # -- the handler's end (on_result) --
    "returned: complete": (
        lambda: decision.on_result(facts(1), RULES, None), Verdict(Action.COMPLETE)),
    "returned on its last attempt: complete": (
        lambda: decision.on_result(facts(5), RULES, None), Verdict(Action.COMPLETE)),
    "failed first attempt: retried after retry_delay": (
        lambda: decision.on_result(facts(1), RULES, ValueError("x"), top),
        Verdict(Action.RETRY, delay=30)),
    "failed second attempt: twice the delay": (
        lambda: decision.on_result(facts(2), RULES, ValueError("x"), top),
        Verdict(Action.RETRY, delay=60)),
    "jitter: a delay is at least half its value": (
        lambda: decision.on_result(facts(2), RULES, ValueError("x"), bottom),
        Verdict(Action.RETRY, delay=30)),
    "the delay stops at max_retry_delay": (
        lambda: decision.on_result(facts(4, attempts_header(5)), Rules(
            RetryPolicy(5, None, 300, 2.0, 600), 60), ValueError("x"), top),
        Verdict(Action.RETRY, delay=600)),
    "a delay past SQS's 12 hours in flight is capped within them": (
        lambda: decision.on_result(facts(1, held=100.0), HALF_DAY, ValueError("x"), top),
        Verdict(Action.RETRY, delay=MAX_RETRY_DELAY_SECONDS - 101)),
    "held 12 hours already: visible again at once": (
        lambda: decision.on_result(facts(1, held=MAX_RETRY_DELAY_SECONDS + 5.0), HALF_DAY,
                                   ValueError("x"), top),
        Verdict(Action.RETRY, delay=0)),
    "last attempt failed: dead-lettered with its cause": (
        lambda: decision.on_result(facts(5), RULES, ValueError("x")),
        Verdict(Action.DEAD_LETTER, "failed: attempts used up (5 of 5)")),
    "the producer's max_attempts 1: the first failure is the last": (
        lambda: decision.on_result(facts(1, attempts_header(1)), RULES, ValueError("x")),
        Verdict(Action.DEAD_LETTER, "failed: attempts used up (1 of 1)")),
    "the consumer's max_attempts 3: the third failure is the last": (
        lambda: decision.on_result(facts(3), FINAL, ValueError("x")),
        Verdict(Action.DEAD_LETTER, "failed: attempts used up (3 of 3)")),
    "KeyboardInterrupt is the handler's failure: retried": (
        lambda: decision.on_result(facts(1), RULES, KeyboardInterrupt(), top),
        Verdict(Action.RETRY, delay=30)),
    "SystemExit is the handler's failure: retried": (
        lambda: decision.on_result(facts(1), RULES, SystemExit(3), top),
        Verdict(Action.RETRY, delay=30)),
    # -- final failures --
    "Unrecoverable on its first attempt: dead-lettered at once": (
        lambda: decision.on_result(facts(1), RULES, Unrecoverable("no such customer 42")),
        Verdict(Action.DEAD_LETTER, "unrecoverable: Unrecoverable: no such customer 42",
                final=True)),
    "a subclass of Unrecoverable is final too": (
        lambda: decision.on_result(facts(2), RULES, type("BadInput", (Unrecoverable,), {})(
            "field x")),
        Verdict(Action.DEAD_LETTER, "unrecoverable: BadInput: field x", final=True)),
    "one of final_errors: dead-lettered at once": (
        lambda: decision.on_result(facts(1), FINAL, PermissionError("denied")),
        Verdict(Action.DEAD_LETTER, "unrecoverable: PermissionError: denied", final=True)),
    "a subclass of one of final_errors is final": (
        lambda: decision.on_result(facts(1), FINAL, Specific("sku")),
        Verdict(Action.DEAD_LETTER, "unrecoverable: Specific: 'sku'", final=True)),
    "an error not in final_errors is retried": (
        lambda: decision.on_result(facts(1), FINAL, Custom("flaky"), top),
        Verdict(Action.RETRY, delay=30)),
    "final on its last attempt: the reason is the final one": (
        lambda: decision.on_result(facts(3), FINAL, KeyError("k")),
        Verdict(Action.DEAD_LETTER, "unrecoverable: KeyError: 'k'", final=True)),
    "without final_errors, KeyError is retried": (
        lambda: decision.on_result(facts(1), RULES, KeyError("k"), top),
        Verdict(Action.RETRY, delay=30)),
    "an empty message is named": (
        lambda: decision.on_result(facts(1), RULES, Unrecoverable()),
        Verdict(Action.DEAD_LETTER, "unrecoverable: Unrecoverable: (no message)", final=True)),
    "characters SQS refuses in an attribute are replaced": (
        lambda: decision.on_result(facts(1), RULES, Unrecoverable("nul\x00 and \x1b[31m")),
        Verdict(Action.DEAD_LETTER, "unrecoverable: Unrecoverable: nul? and ?[31m",
                final=True)),
    "a long message is cut": (
        lambda: decision.on_result(facts(1), RULES, Unrecoverable("y" * 5000)),
        Verdict(Action.DEAD_LETTER, "unrecoverable: Unrecoverable: " + "y" * 1024,
                final=True)),
    # -- held back by a limit or the handler's RateLimited (on_result, on_limited) --
    "RateLimited: held back for its retry_after, not a failure": (
        lambda: decision.on_result(facts(5), RULES, RateLimited(2.5)),
        Verdict(Action.HOLD, "rate_limited", delay=3)),
    "a held job that arrives before its hold ends is held again": (
        lambda: decision.on_receive(Facts(1, {}, hold_left=1200.2), RULES, now=10.0),
        Verdict(Action.HOLD, "rate_limited", delay=1201)),
    "a short wait: in the consumer": (
        lambda: decision.on_limited(0.8, None, ordered=False), decision.RUN),
    "a longer wait: back in its queue after the wait and a spread": (
        lambda: decision.on_limited(4.2, None, ordered=False, holds=3, draw=top),
        Verdict(Action.HOLD, "limited", delay=13)),
    "an ordered channel's job waits in the consumer (a copy would go behind its group)": (
        lambda: decision.on_limited(300.0, None, ordered=True), decision.RUN),
    "lambda: never past the invocation's time left": (
        lambda: decision.on_limited(0.5, 0.4, ordered=True, draw=bottom),
        Verdict(Action.HOLD, "limited", delay=1)),
    "a limit's backlog of held jobs spreads them over the time it needs for them": (
        lambda: decision.on_limited(2.0, None, ordered=False, holds=1, draw=top,
                                    backlog=200.0),
        Verdict(Action.HOLD, "limited", delay=202)),
    "the spread is capped": (
        lambda: decision.on_limited(2.0, None, ordered=False, holds=40, draw=top),
        Verdict(Action.HOLD, "limited", delay=122)),
    # -- the deadline (on_deadline, deadline) --
    "not due yet: run on": (
        lambda: decision.on_deadline(facts(1), RULES, due=160.0, limit=None, now=159.9),
        decision.RUN),
    "past processing_timeout: dead-lettered": (
        lambda: decision.on_deadline(facts(1), RULES, due=160.0, limit=None, now=160.0),
        Verdict(Action.DEAD_LETTER, "processing_timeout: exceeded 60 s")),
    "cancelled by an operator: dead-lettered, naming who": (
        lambda: decision.on_deadline(facts(1, cancelled_by="ana"), RULES, due=120.0,
                                     limit=None, now=120.0),
        Verdict(Action.DEAD_LETTER, "cancelled by ana")),
    "lambda: the invocation ends before the timeout: released, not dead-lettered": (
        lambda: decision.on_deadline(facts(1), LAMBDA, due=130.0, limit=130.0, now=130.5),
        Verdict(Action.RELEASE, "out_of_time")),
    "lambda: no deadline while the store is called, the invocation's end: released": (
        lambda: decision.on_deadline(facts(1), LAMBDA, due=None, limit=130.0),
        Verdict(Action.RELEASE, "out_of_time")),
    "lambda: the timeout before the invocation's end: dead-lettered": (
        lambda: decision.on_deadline(facts(1), LAMBDA, due=120.0, limit=130.0, now=121.0),
        Verdict(Action.DEAD_LETTER, "processing_timeout: exceeded 60 s")),
    "lambda: cancelled, also at the invocation's end: dead-lettered": (
        lambda: decision.on_deadline(facts(1, cancelled_by="bo"), LAMBDA, due=130.0,
                                     limit=130.0),
        Verdict(Action.DEAD_LETTER, "cancelled by bo")),
    "found due by the runtime (no clock): dead-lettered": (
        lambda: decision.on_deadline(facts(1), RULES, due=160.0, limit=None),
        Verdict(Action.DEAD_LETTER, "processing_timeout: exceeded 60 s")),
    # -- a dead letter that cannot be forwarded (on_forward_failed) --
    "fargate: a failed handler's forward failed: kept (back when its lease ends)": (
        lambda: decision.on_forward_failed(RULES, True, "failed: attempts used up (5 of 5)",
                                           RuntimeError("throttled")),
        Verdict(Action.KEEP, "failed: attempts used up (5 of 5)")),
    "fargate: an unreadable message with no DLQ: the consumer stops": (
        lambda: decision.on_forward_failed(RULES, False, "undecodable: x",
                                           RuntimeError("NonExistentQueue")),
        Verdict(Action.STOP_CONSUMER, "RuntimeError: NonExistentQueue")),
    "fargate: a timed-out message with no DLQ: the consumer stops, naming both": (
        lambda: decision.on_forward_failed(RULES, False, "processing_timeout: exceeded 60 s",
                                           RuntimeError("gone"), timed_out=True),
        Verdict(Action.STOP_CONSUMER,
                "processing_timeout: exceeded 60 s; forwarding to the DLQ failed: gone")),
    "lambda: nothing to stop: kept": (
        lambda: decision.on_forward_failed(LAMBDA, False, "undecodable: x",
                                           RuntimeError("NonExistentQueue")),
        Verdict(Action.KEEP, "undecodable: x")),
    # -- an ordered group (after_step) --
    "ordered: a message not finished holds back the rest of its group": (
        lambda: decision.after_step(ordered=True, finished=False, remaining=3),
        Verdict(Action.RELEASE_REST, "group_blocked")),
    "ordered: finished, the group goes on": (
        lambda: decision.after_step(ordered=True, finished=True, remaining=3), decision.RUN),
    "ordered: the last of its group: nothing to release": (
        lambda: decision.after_step(ordered=True, finished=False, remaining=0), decision.RUN),
    "unordered: a failure holds nothing back": (
        lambda: decision.after_step(ordered=False, finished=False, remaining=3), decision.RUN),
}


@pytest.mark.parametrize("name", list(TABLE))
def test_the_decision_table(name: str) -> None:
    decide, expected = TABLE[name]
    assert decide() == expected


@pytest.mark.parametrize(("started", "timeout", "limit", "expected"), [
    (100.0, 60.0, None, 160.0),  # Fargate: its processing timeout
    (100.0, 60.0, 130.0, 130.0),  # Lambda: never past the invocation's end
    (100.0, 60.0, 500.0, 160.0),  # Lambda with time to spare: its processing timeout
])
def test_one_deadline(started: float, timeout: float, limit: float | None,
                      expected: float) -> None:
    assert decision.deadline(started, timeout, limit) == expected


def test_the_table_has_the_cases_the_issue_asks_for() -> None:
    assert len(TABLE) >= 30
    verdicts = {TABLE[name][1].action for name in TABLE}
    assert verdicts == set(Action)


def test_the_rules_of_a_consumer_carry_its_final_errors() -> None:
    class Host:
        retry_policy = RetryPolicy(3, None, 5, 2.0, 600)
        processing_timeout = 30
        final_errors = (KeyError,)

    rules = Rules.of(Host(), can_stop=False)  # type: ignore[arg-type]
    assert rules == Rules(RetryPolicy(3, None, 5, 2.0, 600), 30.0, (KeyError,), False)
