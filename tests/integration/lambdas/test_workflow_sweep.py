"""The 15-minute operations run sweeps the workflows (issue 52): the queue alarm's
`{"scope": "source"}` invocation calls `Workflows.sweep`, so a dependency whose outcome was
recorded but never applied (a consumer killed between its outcome write and advancing what
waits) still releases its dependent. Moto server over HTTP, the handler as Lambda runs it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from messenger.channel import ChannelSpec
from messenger.jobs import workflows
from messenger.jobs.results import FinalOutcome, ResultStore
from messenger.message import DEPENDENCIES_HEADER, META_HEADERS_ATTRIBUTE
from messenger.produce.producer import Producer
from messenger.provision import Provisioner
from tests.integration.helpers import queue_url

from .conftest import FakeContext, LambdaEnv, load_handler


@pytest.fixture
def invoke(lambda_env: LambdaEnv, monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], Any]:
    module = load_handler("queue_alarm", lambda_env, monkeypatch)
    return lambda event: module.handler(event, FakeContext())


def _producer(env: LambdaEnv, channel: str) -> Producer:
    cls = type("SweepProducer", (Producer,), {"channel": channel, "track_status": True})
    return cls(settings=env.settings, clients=env.clients)


def test_the_source_run_releases_a_job_whose_dependency_finished_unapplied(
        lambda_env: LambdaEnv, invoke: Callable[[Any], Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given two channels that keep results, a job on the first, and one on the second held
    # until the first is final
    ns = lambda_env.settings.namespace
    specs = [ChannelSpec(name, namespace=ns, track_status=True, keep_results=True)
             for name in ("sweep_fetch", "sweep_report")]
    provisioner = Provisioner(lambda_env.clients, lambda_env.settings)
    for spec in specs:
        provisioner.ensure_channel(spec)
    producer = _producer(lambda_env, "sweep_fetch")
    fetch = str(producer.push({"url": "s3://in/1"}))
    producer.status.flush()  # its QUEUED record written (it names the job's channel)
    report = str(_producer(lambda_env, "sweep_report").push("report", depends_on=[fetch]))
    # And the first job's outcome recorded by a consumer that died before advancing its
    # waiters: the outcome is there, nothing told the held job
    waiters = ResultStore(lambda_env.clients, lambda_env.settings).finish(
        FinalOutcome.completed(fetch, "sweep_fetch", {"rows": 3}))
    assert waiters == {f"{workflows.JOB}{report}"}
    sqs = lambda_env.clients.client("sqs")
    url = queue_url(sqs, specs[1].queue_name)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    # When the 15-minute run comes (the item past the sweeper's grace, which leaves young
    # items to whoever is writing them)
    monkeypatch.setattr(workflows, "SWEEP_GRACE_SECONDS", 0.0)
    result = invoke({"scope": "source"})
    # Then it applied the outcome and released the job, with its dependency's result
    assert result["workflow_error"] == ""
    assert result["workflows_swept"]["applied"] == 1
    assert result["workflows_swept"]["looked"] >= 1
    (message,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"],
                                     WaitTimeSeconds=1)["Messages"]
    headers = json.loads(message["MessageAttributes"][META_HEADERS_ATTRIBUTE]["StringValue"])
    assert json.loads(headers[DEPENDENCIES_HEADER]) == {fetch: {"result": {"rows": 3}}}
    # And a second run finds nothing left to do
    again = invoke({"scope": "source"})
    assert again["workflows_swept"]["applied"] == 0
    assert again["workflows_swept"]["released"] == 0
