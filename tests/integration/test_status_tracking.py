"""Tracking is a fact of the channel: `ChannelSpec.track_status`, carried by the channel's queues
(tag `messenger:track-status`), is what producers, consumers and the HTTP API read; a status answer
never shows a stale state as current.

The README tour's case over real HTTP: `messenger api --status` takes a job, the tour's consumer
(no `track_status`) runs it and dead-letters it; `GET /jobs/{id}` must not answer QUEUED as if the
job were still waiting."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from messenger import ChannelSpec, Producer
from messenger.api.app import JobApi
from messenger.api.channels import ApiChannel
from messenger.api.local import LocalApi
from messenger.aws import ClientFactory
from messenger.channel import TAG_TRACK_STATUS
from messenger.consume.consumer import ReceivedMessage
from messenger.errors import InvalidChannelSpec
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.provision import Provisioner
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


class UntrackedGreetings(Recording):
    """The README tour's consumer: no track_status; this one fails, so its job is dead-lettered
    after one run."""

    channel = "tour_greetings"
    max_attempts = 1

    def handler(self, message: ReceivedMessage) -> None:
        super().handler(message)
        raise ValueError("no greeting today")


class TrackedGreetings(Recording):
    channel = "tracked_greetings"
    track_status = True


def get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def post(url: str, body: Any) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())


@pytest.fixture
def api(settings: Settings, clients: ClientFactory) -> Iterator[str]:
    """`messenger api --channel tour_greetings --channel tracked_greetings --status`: each
    channel with the API's own track_status on, as `--status` sets it."""
    channels = {name: ApiChannel(name, track_status=True)
                for name in ("tour_greetings", "tracked_greetings")}
    channels.update({name: ApiChannel(name, exchange=True, track_status=True)
                     for name in ("tracked_bus", "untracked_bus")})
    served = LocalApi(JobApi(channels, settings, clients)).start()
    try:
        yield served.url
    finally:
        served.stop()


def test_a_job_whose_consumer_does_not_track_is_not_shown_queued_as_current(
        api: str, running: Any, clients: ClientFactory, settings: Settings,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Given a job posted over HTTP to a channel the API serves with --status
    status, accepted = post(f"{api}/channels/tour_greetings/jobs", {"body": {"name": "Grace"}})
    assert status == 202
    job_id = accepted["job_id"]
    # When the tour's consumer (no track_status) runs it, and it is dead-lettered
    run = running(UntrackedGreetings, retry_delay=0)
    wait_until(lambda: run.consumer.named("dead_lettered"), timeout=30)
    run.stop()
    dlq = drain(clients.client("sqs"), clients.client("sqs").get_queue_url(
        QueueName=UntrackedGreetings.channel_spec(settings.namespace).dlq_name)["QueueUrl"])
    assert [decode(m).message_id for m in dlq] == [job_id]
    # Then its status answer does not present QUEUED as the job's state now
    status, answer = get(f"{api}/jobs/{job_id}")
    assert status == 200, answer
    assert [event["event"] for event in answer["events"]] == ["QUEUED"]
    assert answer["status"] == "QUEUED"  # the last recorded state ...
    assert answer["tracked"] is False and answer["current"] is False  # ... marked as such
    assert "progress not recorded" in answer["note"]
    assert "'tour_greetings'" in answer["note"] and "track_status=False" in answer["note"]
    # And `messenger status` says the same
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    assert cli.main(["status", job_id]) == 0
    out = capsys.readouterr().out
    assert "QUEUED" in out and "note: progress not recorded" in out, out
    # And so does the dashboard's job page
    with served(settings, clients) as dash:
        page = requests.get(f"{dash.url}/job?id={job_id}", timeout=60)
    assert page.status_code == 200
    assert "progress not recorded" in page.text and "QUEUED" in page.text


def test_a_tracked_channels_answer_is_current(api: str, running: Any) -> None:  # noqa: F811
    status, accepted = post(f"{api}/channels/tracked_greetings/jobs", {"body": {"name": "Ada"}})
    assert status == 202
    run = running(TrackedGreetings)

    def completed() -> Any:
        code, answer = get(f"{api}/jobs/{accepted['job_id']}")
        return code == 200 and answer["status"] == "COMPLETED" and answer

    answer = wait_until(completed, timeout=30)
    run.stop()
    assert answer["tracked"] is True and answer["current"] is True and "note" not in answer
    assert [e["event"] for e in answer["events"]][0] == "QUEUED"


class TrackedBusAudit(Recording):
    channel = "tracked_bus.tracked_audit"
    track_status = True


class UntrackedBusAudit(Recording):
    channel = "untracked_bus.plain_audit"


def test_an_exchanges_answer_reads_its_channels(api: str, running: Any) -> None:  # noqa: F811
    # Given an exchange whose channel tracks, and one whose channel does not, each subscribed
    tracked, untracked = running(TrackedBusAudit), running(UntrackedBusAudit)
    for run in (tracked, untracked):
        wait_until(lambda r=run: r.consumer.resources or not r.thread.is_alive(), timeout=30)
        assert run.error is None and run.consumer.resources, (run.error, run.code)
    # When a job is posted to each exchange and handled
    ids = {}
    for bus in ("tracked_bus", "untracked_bus"):
        status, accepted = post(f"{api}/channels/{bus}/jobs", {"body": {"bus": bus}})
        assert status == 202
        ids[bus] = accepted["job_id"]
    wait_until(lambda: tracked.consumer.handled and untracked.consumer.handled, timeout=30)

    def completed() -> Any:
        code, answer = get(f"{api}/jobs/{ids['tracked_bus']}")
        return code == 200 and answer["status"] == "COMPLETED" and answer

    # Then the tracked one's answer holds its channel's records, current
    answer = wait_until(completed, timeout=30)
    assert answer["tracked"] is True and answer["current"] is True
    assert {"QUEUED", "RECEIVED", "COMPLETED"} <= {e["event"] for e in answer["events"]}
    # And the other's says its QUEUED is only the last recorded state
    code, answer = get(f"{api}/jobs/{ids['untracked_bus']}")
    assert code == 200 and answer["status"] == "QUEUED"
    assert answer["tracked"] is False and answer["current"] is False
    assert "progress not recorded" in answer["note"]
    tracked.stop()
    untracked.stop()


def test_the_channels_queues_carry_its_declaration(settings: Settings,
                                                   clients: ClientFactory) -> None:
    sqs = clients.client("sqs")
    spec = ChannelSpec("declared_jobs", namespace=settings.namespace,
                       priorities=("high", "low"), track_status=True)
    resources = Provisioner(clients, settings).ensure_channel(spec)
    for level in resources.levels:
        for queue in (level.queue, level.dlq):
            assert sqs.list_queue_tags(QueueUrl=queue.url)["Tags"][TAG_TRACK_STATUS] == "true"
    # A consumer class (auto mode) re-declares the channel as its spec says
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        "declared_jobs", namespace=settings.namespace, priorities=("high", "low")))
    assert {sqs.list_queue_tags(QueueUrl=level.queue.url)["Tags"][TAG_TRACK_STATUS]
            for level in resources.levels} == {"false"}


def test_a_verify_mode_consumer_that_disagrees_with_the_channel_does_not_start(
        settings: Settings, clients: ClientFactory, running: Any) -> None:  # noqa: F811
    # Given a channel deployed (here: provisioned) with track_status=True
    Provisioner(clients, settings).ensure_channel(
        ChannelSpec(UntrackedGreetings.channel, namespace=settings.namespace, track_status=True))
    # When a consumer class without track_status starts against it in verify mode
    run = running(UntrackedGreetings, {"provisioning": "verify"})
    run.thread.join(30)
    # Then it does not start, and says why
    assert isinstance(run.error, InvalidChannelSpec), (run.error, run.code)
    assert "UntrackedGreetings.track_status is False" in str(run.error)
    assert "track_status=True" in str(run.error)
    assert run.consumer.handled == []


def test_a_producer_follows_the_channels_declaration(settings: Settings,
                                                     clients: ClientFactory) -> None:
    provisioner = Provisioner(clients, settings)
    provisioner.ensure_channel(ChannelSpec("follow_tracked", namespace=settings.namespace,
                                           track_status=True))
    provisioner.ensure_channel(ChannelSpec("follow_untracked", namespace=settings.namespace))
    tracked = type("Tracked", (Producer,), {"channel": "follow_tracked"})(settings=settings,
                                                                          clients=clients)
    untracked = type("Untracked", (Producer,), {"channel": "follow_untracked"})(
        settings=settings, clients=clients)
    first, second = tracked.push({"n": 1}), untracked.push({"n": 2})
    assert tracked.status is not None and untracked.status is None
    tracked.status.flush()
    store = StatusStore(clients, settings)
    assert [r.event for r in store.timeline(first)] == [StatusEvent.QUEUED]
    assert store.timeline(second) == []
    with pytest.raises(Exception, match="track_status must be True, False or None"):
        type("Bad", (Producer,), {"channel": "follow_tracked", "track_status": "yes"})(
            settings=settings, clients=clients)
