"""botocore's retry handler held to a deadline (messenger.fastboto.retries), without a network."""

from __future__ import annotations

from typing import Any

import boto3
from botocore.config import Config

from messenger.fastboto.retries import BoundedRetries, bound_retries


class Handler:
    """Stands in for botocore's `RetryHandler.needs_retry`: answers `answer`, counts its calls
    (each one that would retry takes a token from botocore's retry quota)."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.calls = answer, 0

    def __call__(self, **_: Any) -> Any:
        self.calls += 1
        return self.answer


def bounded(answer: Any, deadline: float | None, now: float) -> tuple[BoundedRetries, Handler]:
    handler = Handler(answer)
    return BoundedRetries(handler, lambda: deadline, clock=lambda: now), handler


def test_past_the_deadline_no_retry_and_botocore_is_not_asked():
    retries, handler = bounded(4.0, deadline=10.0, now=10.0)
    # False, not None: the endpoint retries no more and no later handler is taken instead
    assert retries(attempts=1) is False
    assert handler.calls == 0  # so no retry token is taken for a retry never made


def test_before_the_deadline_botocore_decides_and_its_backoff_is_capped_at_the_time_left():
    assert bounded(4.0, deadline=10.0, now=9.5)[0](attempts=1) == 0.5
    assert bounded(0.2, deadline=10.0, now=9.5)[0](attempts=1) == 0.2
    # botocore's "no retry" answers pass as they are
    assert bounded(None, deadline=10.0, now=9.5)[0](attempts=1) is None
    assert bounded(False, deadline=10.0, now=9.5)[0](attempts=1) is False
    # and without a deadline its delay too
    assert bounded(4.0, deadline=None, now=9.5)[0](attempts=1) == 4.0


def needs_retry_handlers(client: Any) -> list[Any]:
    return list(client.meta.events._emitter._handlers.prefix_search(
        "needs-retry.sqs.ReceiveMessage"))


def test_a_standard_mode_client_gets_its_own_handler_wrapped_once():
    client = boto3.client("sqs", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
                          config=Config(retries={"mode": "standard"}))
    botocores = needs_retry_handlers(client)
    assert bound_retries(client, lambda: None) is True
    wrapped = needs_retry_handlers(client)
    assert len(wrapped) == len(botocores) == 1
    assert isinstance(wrapped[0], BoundedRetries) and wrapped[0].retry == botocores[0]
    # and a second call finds botocore's handler no more: left alone
    assert bound_retries(client, lambda: None) is False
    assert needs_retry_handlers(client) == wrapped


def test_a_legacy_mode_client_is_left_alone():
    client = boto3.client("sqs", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
                          config=Config(retries={"mode": "legacy"}))
    before = needs_retry_handlers(client)
    assert bound_retries(client, lambda: None) is False
    assert needs_retry_handlers(client) == before
