"""Final failures on the moto server: a handler that raises `messenger.Unrecoverable`, or one of
its consumer's `final_errors`, has its message dead-lettered at once (attempts left unused),
its reason 'unrecoverable: <type>: <message>', on Fargate's runtime and on Lambda's; the reason
travels where every dead-letter reason does (the DLQ message's reason attribute, the status
record) and is shown by `messenger dlq`, GET /jobs/{id} and the dashboard."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from messenger import Consumer, ReceivedMessage, Unrecoverable
from messenger.api.app import JobApi
from messenger.api.channels import ApiChannel
from messenger.api.local import LocalApi
from messenger.aws import ClientFactory
from messenger.errors import InvalidChannelSpec
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.message import DEAD_LETTER_REASON_ATTRIBUTE
from messenger.settings import Settings
from messenger.tools import cli
from tests.dashboard import served
from tests.integration.helpers import decode, drain
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    running,
    runtime,
    wait_until,
)
from tests.integration.test_outcome_table import (  # noqa: F401 - the harness fixture
    VERDICT_EVENTS,
    Case,
    TableJobs,
    harness,
)
from tests.integration.test_status_tracking import get, post


class OutOfStock(LookupError):
    pass


class FinalJobs(TableJobs):
    """TableJobs (5 attempts) whose handler raises Unrecoverable on {"bad": ...}, OutOfStock
    (one of its final_errors) on {"stock": ...}; its channel tracks status."""

    channel = "final_jobs"
    track_status = True
    final_errors = (OutOfStock,)

    def handler(self, message: ReceivedMessage) -> None:
        super().handler(message)
        body = message.body if isinstance(message.body, dict) else {}
        if "bad" in body:
            raise Unrecoverable(f"no customer {body['bad']}")
        if "stock" in body:
            raise OutOfStock(f"sku {body['stock']} discontinued")


FINAL_CASES = {
    "Unrecoverable": (Case(body={"bad": 42}, consumer=FinalJobs, event="dead_lettered",
                           reason="unrecoverable: Unrecoverable: no customer 42",
                           failed_as="Unrecoverable")),
    "one of final_errors": (Case(body={"stock": "A-7"}, consumer=FinalJobs,
                                 event="dead_lettered",
                                 reason="unrecoverable: OutOfStock: sku A-7 discontinued",
                                 failed_as="OutOfStock")),
    "another error is retried": (Case(body={"fail": True}, consumer=FinalJobs, event="retried",
                                      failed_as="ValueError")),
}


@pytest.mark.parametrize("runtime_name", ["fargate", "lambda"])
@pytest.mark.parametrize("name", list(FINAL_CASES))
def test_a_final_failure_is_dead_lettered_at_once_on_both_runtimes(
        harness: Any, settings: Settings, clients: ClientFactory,  # noqa: F811
        runtime_name: str, name: str) -> None:
    case = FINAL_CASES[name]
    # Given the case's message, on its first of 5 attempts
    url, dlq = harness.send(case)
    # When the runtime runs it once
    consumer = harness.fargate(case) if runtime_name == "fargate" \
        else harness.lambda_(case, url)
    # Then it failed once, and was dead-lettered at once (or retried: not final)
    assert len(consumer.handled) == 1
    [failed] = [e for e in consumer.events if e.name == "failed"]
    assert failed.fields["error_class"] == case.failed_as
    [verdict] = [e for e in consumer.events if e.name in VERDICT_EVENTS]
    assert verdict.name == case.event, consumer.events
    if case.reason is None:
        assert "final" not in failed.fields
        assert drain(harness.sqs, dlq) == []
        return
    assert failed.fields["final"] is True and failed.fields["receive_count"] == 1
    assert verdict.fields["reason"] == case.reason
    # And the DLQ message carries the reason, the queue holds nothing more
    [dead] = drain(harness.sqs, dlq)
    assert dead["MessageAttributes"][DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"] == case.reason
    assert drain(harness.sqs, url) == []
    # And the status record of the dead letter says so
    store = StatusStore(clients, settings)
    job = decode(dead).message_id
    timeline = wait_until(lambda: [r for r in store.timeline(job)
                                   if r.event is StatusEvent.DEAD_LETTERED], 30)
    assert timeline[-1].error == case.reason


class TrackedOrders(Recording):
    channel = "final_orders"
    track_status = True  # 3 attempts (the default max_receives)

    def handler(self, message: ReceivedMessage) -> None:
        super().handler(message)
        raise Unrecoverable(f"order {message.body['order']} refers to a deleted account")


def test_the_reason_is_shown_by_the_cli_the_http_api_and_the_dashboard(
        settings: Settings, clients: ClientFactory, running: Any,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    reason = "unrecoverable: Unrecoverable: order 7 refers to a deleted account"
    served_api = LocalApi(JobApi({"final_orders": ApiChannel("final_orders", track_status=True)},
                                 settings, clients)).start()
    try:
        # Given a job posted over HTTP whose handler says its failure is final
        code, accepted = post(f"{served_api.url}/channels/final_orders/jobs",
                              {"body": {"order": 7}})
        assert code == 202
        job = accepted["job_id"]
        # When the consumer runs it (3 attempts allowed)
        run = running(TrackedOrders, retry_delay=0)
        wait_until(lambda: run.consumer.named("dead_lettered"), timeout=30)
        run.stop()
        assert len(run.consumer.handled) == 1

        # Then GET /jobs/{id} ends DEAD_LETTERED with the reason
        def dead_lettered() -> Any:
            status, answer = get(f"{served_api.url}/jobs/{job}")
            return status == 200 and answer["status"] == "DEAD_LETTERED" and answer

        answer = wait_until(dead_lettered, timeout=30)
    finally:
        served_api.stop()
    assert answer["events"][-1]["error"] == reason
    # And `messenger dlq list` and `show` show it
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    assert cli.main(["dlq", "list", "final_orders"]) == 0
    assert reason in capsys.readouterr().out
    assert cli.main(["dlq", "show", "final_orders", job]) == 0
    assert reason in capsys.readouterr().out
    # And so does the dashboard's job page
    with served(settings, clients) as dash:
        page = requests.get(f"{dash.url}/job?id={job}", timeout=60)
    assert page.status_code == 200
    assert "unrecoverable: Unrecoverable: order 7 refers to a deleted account" in page.text


@pytest.mark.parametrize("value", [KeyError, (KeyError, "oops"), [KeyError], (int,)])
def test_final_errors_must_be_a_tuple_of_exception_classes(
        settings: Settings, clients: ClientFactory, value: Any) -> None:
    class Misconfigured(Consumer):
        channel = "final_misconfigured"
        final_errors = value

        def handler(self, message: ReceivedMessage) -> None:
            pass

    with pytest.raises(InvalidChannelSpec) as raised:
        Misconfigured(settings=settings, clients=clients)
    assert str(raised.value) == (
        f"Misconfigured.final_errors must be a tuple of exception classes, e.g. "
        f"(ValueError, KeyError), got {value!r}")
