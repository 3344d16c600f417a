"""The local endpoint sweeps the workflows itself (`messenger.tools.workflow_sweeper`), as the
15-minute operations run does on AWS: a dependency whose outcome was recorded but never applied
(its consumer died in between) still releases its dependent, without any deployed Lambda. On
the moto server over HTTP; the pass is run here, on the test's clock settings."""

from __future__ import annotations

import json

import pytest

from messenger import Producer
from messenger.aws import ClientFactory
from messenger.channel import ChannelSpec, workflows_table_name
from messenger.jobs import workflows
from messenger.jobs.results import FinalOutcome, ResultStore
from messenger.message import DEPENDENCIES_HEADER, META_HEADERS_ATTRIBUTE
from messenger.provision import Provisioner
from messenger.settings import Settings
from messenger.tools.workflow_sweeper import WorkflowSweeper, namespaces
from tests.integration.helpers import queue_url


def test_namespaces_are_read_from_the_table_names() -> None:
    names = [workflows_table_name(""), workflows_table_name("shop"),
             workflows_table_name("shop-eu"), "shop-messenger-status", "other-table"]
    assert namespaces(names) == ["", "shop", "shop-eu"]


def test_a_pass_releases_what_a_dead_consumer_left_waiting(
        settings: Settings, clients: ClientFactory, endpoint: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a held job whose dependency's outcome is recorded and was never applied
    specs = [ChannelSpec(name, namespace=settings.namespace, track_status=True,
                         keep_results=True) for name in ("local_fetch", "local_report")]
    for spec in specs:
        Provisioner(clients, settings).ensure_channel(spec)
    producers = [type("P", (Producer,), {"channel": spec.name, "track_status": True})(
        settings=settings, clients=clients) for spec in specs]
    fetch = str(producers[0].push({"day": 1}))
    producers[0].status.flush()
    report = str(producers[1].push("report", depends_on=[fetch]))
    ResultStore(clients, settings).finish(FinalOutcome.completed(fetch, "local_fetch", 7))
    # When the endpoint's sweeper makes a pass (the item past the grace it leaves to writers)
    monkeypatch.setattr(workflows, "SWEEP_GRACE_SECONDS", 0.0)
    swept = WorkflowSweeper(endpoint).run_once()
    # Then it applied the outcome in the test's namespace, and the job is in its queue
    assert swept[settings.namespace]["applied"] == 1
    sqs = clients.client("sqs")
    (message,) = sqs.receive_message(QueueUrl=queue_url(sqs, specs[1].queue_name),
                                     MessageAttributeNames=["All"],
                                     WaitTimeSeconds=1)["Messages"]
    headers = json.loads(message["MessageAttributes"][META_HEADERS_ATTRIBUTE]["StringValue"])
    assert json.loads(headers[DEPENDENCIES_HEADER]) == {fetch: {"result": 7}}
    assert workflows.Workflows(clients, settings).dependencies_of(report).state is \
        workflows.State.RELEASED
