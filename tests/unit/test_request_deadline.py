"""One deadline for every call of a block (messenger.aws.deadline_scope), as an API request
holds its AWS calls to its own: retries and backoffs stop at it, nested budgets keep the
earlier deadline, and the scope ends with its block."""

from __future__ import annotations

import time

from botocore.exceptions import EndpointConnectionError

from messenger.aws import BoundedRetries, call_with_budget, deadline_scope, retry_deadline


def test_a_scope_sets_the_retry_deadline_of_its_block_and_restores_the_outer_one() -> None:
    before = retry_deadline()
    with deadline_scope(123.0):
        assert retry_deadline() == 123.0
        with deadline_scope(500.0):  # a later inner deadline does not extend the outer one
            assert retry_deadline() == 123.0
        with deadline_scope(50.0):
            assert retry_deadline() == 50.0
        assert retry_deadline() == 123.0
    assert retry_deadline() == before


def test_a_budget_inside_a_scope_stops_at_the_scopes_deadline() -> None:
    seen: list[float | None] = []
    with deadline_scope(time.monotonic() + 1.0):
        scope = retry_deadline()
        call_with_budget(lambda: seen.append(retry_deadline()), 60.0, "a call")
    assert seen == [scope]


def test_no_retry_and_no_backoff_past_the_scopes_deadline() -> None:
    failure = EndpointConnectionError(endpoint_url="https://dynamodb.example")
    retries = BoundedRetries(draw=lambda high: high)  # reads the thread's deadline
    now = time.monotonic()
    with deadline_scope(now + 0.25):
        delay = retries(attempts=3, caught_exception=failure)
        assert isinstance(delay, float) and 0 < delay <= 0.25  # capped at the time left
    with deadline_scope(now - 1.0):
        assert retries(attempts=1, caught_exception=failure) is False
