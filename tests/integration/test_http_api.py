"""The HTTP job API over real HTTP: `JobApi` served by `messenger.api.local.LocalApi` on a free
loopback port (the adapter builds API Gateway REST proxy events from the requests), producing to
the moto server; a stdlib HTTP client calls it over TCP, as curl or another service would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from messenger.api.app import JobApi, job_id_for_key
from messenger.api.channels import ApiChannel
from messenger.api.local import LocalApi
from messenger.api.requests import MAX_BATCH_JOBS, MAX_DELAY_SECONDS, MAX_REQUEST_BYTES
from messenger.aws import ClientFactory
from messenger.channel import queue_name_for
from messenger.jobs.fired import JOB_WINDOW_HEADER
from messenger.jobs.schedule_store import ScheduleStore
from messenger.settings import Settings
from tests.faults import Throttle, injected
from tests.integration.helpers import decode, drain
from tests.integration.helpers import queue_url as url_of
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    running,
    runtime,
    wait_until,
)

CHANNELS = {
    "http_jobs": ApiChannel("http_jobs", track_status=True),
    "http_levels": ApiChannel("http_levels", priorities=("high", "default", "low")),
}


class HttpJobsConsumer(Recording):
    channel = "http_jobs"
    track_status = True


class Reply:
    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status, self.headers, self.raw = status, headers, body

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


Call = Callable[..., Reply]


def _call(base: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
          headers: dict[str, str] | None = None) -> Reply:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(
        base + path, data=data, method=method,
        headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return Reply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, error.headers, error.read())


@pytest.fixture
def serve(settings: Settings, clients: ClientFactory) -> Iterator[Callable[..., LocalApi]]:
    started: list[LocalApi] = []

    def start(**changes: Any) -> LocalApi:
        api = JobApi(CHANNELS, settings.with_changes(**changes), clients)
        started.append(LocalApi(api).start())
        return started[-1]

    yield start
    for api in started:
        api.stop()


@pytest.fixture
def call(serve: Callable[..., LocalApi]) -> Call:
    api = serve()
    return lambda *args, **kwargs: _call(api.url, *args, **kwargs)


def _queue(clients: ClientFactory, settings: Settings, name: str) -> str:
    return url_of(clients.client("sqs"), queue_name_for(name, settings.namespace))


def test_a_job_posted_over_http_is_consumed(call: Call, running: Any) -> None:  # noqa: F811
    # When a client posts one job
    reply = call("POST", "/channels/http_jobs/jobs", {"body": {"name": "Ada"}})
    # Then it is accepted, with its id and where to read its status
    assert reply.status == 202, reply.raw
    job_id = reply.json["job_id"]
    assert reply.headers["Location"] == f"/jobs/{job_id}"
    # And a consumer of the channel handles it, with that message id
    run = running(HttpJobsConsumer)
    handled = wait_until(lambda: run.consumer.handled)
    assert [(m.body, m.message_id) for m in handled] == [({"name": "Ada"}, job_id)]
    # And its status timeline is readable at the Location
    timeline = wait_until(lambda: (r := call("GET", reply.headers["Location"])).status == 200
                          and "COMPLETED" in [e["event"] for e in r.json["events"]] and r)
    assert timeline.json["job_id"] == job_id and timeline.json["channel"] == "http_jobs"
    assert timeline.json["events"][0]["event"] == "QUEUED"


def test_a_job_due_later_is_scheduled_and_its_status_says_when(
        call: Call, clients: ClientFactory, settings: Settings) -> None:
    # When a client posts a job due in two hours (a zone offset, not only Z)
    due = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    at = due.astimezone(timezone(timedelta(hours=2))).isoformat()
    reply = call("POST", "/channels/http_jobs/jobs", {"body": {"n": 1}, "at": at})
    # Then it is accepted as scheduled, with its due time in UTC
    assert reply.status == 202, reply.raw
    assert reply.json["status"] == "scheduled"
    assert reply.json["due_at"] == due.strftime("%Y-%m-%dT%H:%M:%SZ")
    job_id = reply.json["job_id"]
    # And it waits as a one-time schedule, not in the queue
    assert [job.job_id for job in ScheduleStore(clients, settings).list("http_jobs")] == [job_id]
    assert drain(clients.client("sqs"), _queue(clients, settings, "http_jobs")) == []
    # And its status timeline starts SCHEDULED
    timeline = call("GET", f"/jobs/{job_id}")
    assert timeline.status == 200 and timeline.json["status"] == "SCHEDULED"


def test_a_short_delay_is_sqs_delay_seconds(call: Call, running: Any) -> None:  # noqa: F811
    # When a job is posted with a delay SQS can hold (standard queue, up to 900 s)
    posted_at = time.time()
    reply = call("POST", "/channels/http_jobs/jobs", {"body": {"n": 2}, "delay_seconds": 2})
    # Then it is accepted (in its queue, hidden until due), with its due time
    assert reply.status == 202, reply.raw
    assert reply.json["status"] == "accepted" and reply.json["due_at"].endswith("Z")
    # And a consumer runs it no earlier than due
    run = running(HttpJobsConsumer)
    (message,) = wait_until(lambda: run.consumer.handled, timeout=30)
    assert message.message_id == reply.json["job_id"]
    assert time.time() - posted_at >= 2


def test_a_batch_job_with_its_own_time_is_scheduled_beside_the_others(
        call: Call, clients: ClientFactory, settings: Settings) -> None:
    at = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    reply = call("POST", "/channels/http_jobs/jobs/batch",
                 {"jobs": [{"body": 1}, {"body": 2, "at": at}, {"body": 3, "at": "soon"}]})
    assert reply.status == 207, reply.raw
    now, later, bad = reply.json["jobs"]
    assert (now["status"], later["status"], bad["status"]) == (202, 202, 400)
    assert later["scheduled"] is True and later["due_at"] == at
    assert "at" in bad["error"] and "RFC 3339" in bad["error"]
    held = drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
    assert [decode(m).message_id for m in held] == [now["job_id"]]
    assert [job.job_id for job in ScheduleStore(clients, settings).list("http_jobs")] == [
        later["job_id"]]


def test_the_status_of_an_unknown_job_is_404(call: Call) -> None:
    reply = call("GET", "/jobs/no-such-job")
    assert reply.status == 404
    assert "no-such-job" in reply.json["error"]


def test_a_batch_with_one_bad_job_accepts_the_others_and_names_the_bad_one(
        call: Call, clients: ClientFactory, settings: Settings) -> None:
    # When a batch holds two good jobs and one with an unknown priority
    jobs = [{"body": 1, "priority": "high"}, {"body": 2, "priority": "urgent"}, {"body": 3}]
    reply = call("POST", "/channels/http_levels/jobs/batch", {"jobs": jobs})
    # Then the batch is a multi-status: the good ones accepted, the bad one named with the levels
    assert reply.status == 207, reply.raw
    results = reply.json["jobs"]
    assert [r["status"] for r in results] == [202, 400, 202]
    assert "urgent" in results[1]["error"] and "high, default, low" in results[1]["error"]
    assert "job_id" not in results[1]
    # And exactly the good ones are in their levels' queues
    sqs = clients.client("sqs")
    high = drain(sqs, _queue(clients, settings, "http_levels-high"))
    default = drain(sqs, _queue(clients, settings, "http_levels-default"))
    assert [decode(m).message_id for m in high] == [results[0]["job_id"]]
    assert [decode(m).body for m in default] == [3]


def test_a_batch_whose_jobs_are_all_valid_is_202(call: Call) -> None:
    reply = call("POST", "/channels/http_jobs/jobs/batch", {"jobs": [{"body": i} for i in
                                                                      range(MAX_BATCH_JOBS)]})
    assert reply.status == 202
    assert len({r["job_id"] for r in reply.json["jobs"]}) == MAX_BATCH_JOBS


def test_the_same_idempotency_key_and_job_again_answers_the_first_id_and_sends_nothing(
        call: Call, clients: ClientFactory, settings: Settings) -> None:
    job = {"body": {"order": "A-1"}}
    first = call("POST", "/channels/http_jobs/jobs", job, headers={"Idempotency-Key": "order-A-1"})
    again = call("POST", "/channels/http_jobs/jobs", job, headers={"Idempotency-Key": "order-A-1"})
    assert (first.status, again.status) == (202, 202)
    assert again.json["job_id"] == first.json["job_id"] == job_id_for_key("http_jobs",
                                                                            "order-A-1")
    assert again.headers["Idempotent-Replayed"] == "true"
    # The same key with another job is refused; a new key is a new job
    other = call("POST", "/channels/http_jobs/jobs", {"body": {"order": "B"}},
                 headers={"Idempotency-Key": "order-A-1"})
    assert other.status == 422 and "another job" in other.json["error"]
    fresh = call("POST", "/channels/http_jobs/jobs", job, headers={"Idempotency-Key": "order-A-2"})
    assert fresh.status == 202 and fresh.json["job_id"] != first.json["job_id"]
    # Then two messages were sent, one per key
    held = drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
    assert sorted(decode(m).message_id for m in held) == sorted(
        [first.json["job_id"], fresh.json["job_id"]])
    # each marked for the consumer's claim of its job id for the key's window (issue 49 item 6)
    assert all(decode(m).meta_headers.get(JOB_WINDOW_HEADER) == "86400" for m in held)


def _again_while_the_first_is_sent(call: Call, clients: ClientFactory, operation: str,
                                   path: str, body: Any, key: str) -> tuple[Reply, Reply, int]:
    """A request held inside its SQS send (`operation`) while the same request with the same
    Idempotency-Key arrives: (the first's answer, the second's, how many sends were made)."""
    entered, release = threading.Event(), threading.Event()
    sends: list[str] = []

    def hold(**_: Any) -> None:
        sends.append(operation)
        entered.set()
        release.wait(20)

    first: list[Reply] = []
    with injected(clients, f"before-send.sqs.{operation}", hold):
        thread = threading.Thread(target=lambda: first.append(call(
            "POST", path, body, headers={"Idempotency-Key": key})))
        thread.start()
        assert entered.wait(20)
        second = call("POST", path, body, headers={"Idempotency-Key": key})
        release.set()
        thread.join(30)
    return first[0], second, len(sends)


def test_a_key_still_being_accepted_is_409_and_the_job_is_sent_once(
        call: Call, clients: ClientFactory, settings: Settings) -> None:
    # Given a first request held inside its SendMessage, when the same key arrives meanwhile
    job = {"body": {"slow": True}}
    first, second, _ = _again_while_the_first_is_sent(
        call, clients, "SendMessage", "/channels/http_jobs/jobs", job, "slow-1")
    # Then it is told to come back, and the first is accepted
    assert second.status == 409 and int(second.headers["Retry-After"]) > 0
    assert first.status == 202
    # And a retry after it answers the first id; one message was sent
    retry = call("POST", "/channels/http_jobs/jobs", job, headers={"Idempotency-Key": "slow-1"})
    assert retry.status == 202 and retry.json["job_id"] == first.json["job_id"]
    assert len(drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))) == 1


def test_throttled_sqs_after_the_claim_is_429_without_a_message_and_the_retry_sends_it(
        serve: Callable[..., LocalApi], clients: ClientFactory, settings: Settings) -> None:
    api = serve(retry_budget_seconds=1.0)
    job = {"body": {"n": 1}}
    # Given SQS throttles every SendMessage (after the idempotency and dedup claims are made)
    with injected(clients, "before-send.sqs.SendMessage", Throttle(1.0, {"SendMessage"})):
        refused = _call(api.url, "POST", "/channels/http_jobs/jobs", job,
                        headers={"Idempotency-Key": "t-1"})
    # Then the answer is 429 with Retry-After, and nothing is in the queue
    assert refused.status == 429, refused.raw
    assert int(refused.headers["Retry-After"]) > 0
    sqs = clients.client("sqs")
    assert drain(sqs, _queue(clients, settings, "http_jobs")) == []
    # When the client retries with the same key once SQS recovers: accepted and sent, once
    accepted = _call(api.url, "POST", "/channels/http_jobs/jobs", job,
                     headers={"Idempotency-Key": "t-1"})
    assert accepted.status == 202, accepted.raw
    held = drain(sqs, _queue(clients, settings, "http_jobs"))
    assert [decode(m).message_id for m in held] == [accepted.json["job_id"]]


def test_a_5_mb_body_is_offloaded_to_s3_and_consumed_intact(
        call: Call, running: Any) -> None:  # noqa: F811
    text = "x" * (5 * 1024 * 1024)
    reply = call("POST", "/channels/http_jobs/jobs", {"body": {"blob": text}})
    assert reply.status == 202, reply.raw[:300]
    run = running(HttpJobsConsumer)
    (message,) = wait_until(lambda: run.consumer.handled, timeout=60)
    assert message.body == {"blob": text} and message.message_id == reply.json["job_id"]


BAD_INPUTS = [
    # (what, path, request, status, words the one error line holds)
    ("malformed JSON", "/channels/http_jobs/jobs", {"raw": b'{"body": '}, 400,
     ["not valid JSON"]),
    ("no body field", "/channels/http_jobs/jobs", {"body": {"priority": "high"}}, 400,
     ["body", "Field required"]),
    ("max_attempts of the wrong type", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "max_attempts": "3"}}, 400, ["max_attempts", "integer"]),
    ("max_attempts out of range", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "max_attempts": 0}}, 400, ["max_attempts", "greater than or equal"]),
    ("an unknown field", "/channels/http_jobs/jobs", {"body": {"body": 1, "prio": "x"}}, 400,
     ["prio", "unknown field", "priority"]),
    ("not an object", "/channels/http_jobs/jobs", {"body": [1, 2]}, 400, ["object"]),
    ("unknown channel", "/channels/nowhere/jobs", {"body": {"body": 1}}, 404,
     ["nowhere", "http_jobs"]),
    ("unknown priority", "/channels/http_levels/jobs", {"body": {"body": 1, "priority": "top"}},
     400, ["priority", "top", "high, default, low"]),
    ("a priority on a channel without levels", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "priority": "high"}}, 400, ["priority", "declares no priorities"]),
    ("at without a zone", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "at": "2030-01-01T09:00:00"}}, 400, ["at", "RFC 3339", "zone", "Z"]),
    ("at as a number", "/channels/http_jobs/jobs", {"body": {"body": 1, "at": 1893488400}}, 400,
     ["at", "RFC 3339", "1893488400"]),
    ("at on no such day", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "at": "2030-02-30T09:00:00Z"}}, 400, ["at", "no such date"]),
    ("at in the past", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "at": "2020-01-01T09:00:00Z"}}, 400, ["at=", "in the past"]),
    ("at and delay_seconds together", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "at": (datetime.now(UTC) + timedelta(days=30)).strftime(
         "%Y-%m-%dT%H:%M:%SZ"), "delay_seconds": 5}}, 400,
     ["at, delay_seconds", "not both"]),
    ("a negative delay", "/channels/http_jobs/jobs", {"body": {"body": 1, "delay_seconds": -1}},
     400, ["delay_seconds", "greater than or equal to 0"]),
    ("a delay beyond a year", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "delay_seconds": MAX_DELAY_SECONDS + 1}}, 400,
     ["delay_seconds", f"less than or equal to {MAX_DELAY_SECONDS}"]),
    ("oversized", "/channels/http_jobs/jobs",
     {"raw": b'{"body": "' + b"x" * MAX_REQUEST_BYTES + b'"}'}, 413, [str(MAX_REQUEST_BYTES)]),
    ("wrong content type", "/channels/http_jobs/jobs",
     {"raw": b"body=1", "headers": {"Content-Type": "application/x-www-form-urlencoded"}}, 415,
     ["Content-Type", "application/json"]),
    ("a batch of 11", "/channels/http_jobs/jobs/batch",
     {"body": {"jobs": [{"body": i} for i in range(MAX_BATCH_JOBS + 1)]}}, 400,
     ["jobs", "at most 10"]),
    ("an empty Idempotency-Key", "/channels/http_jobs/jobs",
     {"body": {"body": 1}, "headers": {"Idempotency-Key": ""}}, 400, ["Idempotency-Key"]),
    # issue 49 item 1: an array is not one job (the router sent its first element)
    ("a JSON array of jobs", "/channels/http_jobs/jobs",
     {"body": [{"body": 1}, {"body": 2}]}, 400,
     ["request body", "JSON object", "array", "/channels/{channel}/jobs/batch"]),
    ("an array wrapping a batch", "/channels/http_jobs/jobs/batch",
     {"body": [{"jobs": [{"body": 1}]}]}, 400, ["request body", '{"jobs": [', "array"]),
    # issue 49 item 3: one range for at and delay_seconds (was a 500 / an accepted 2099)
    ("at at the end of time", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "at": "9999-12-31T23:59:59.5Z"}}, 400,
     ["at:", "366 days ahead", "delay_seconds"]),
    ("at at the end of time, west of UTC", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "at": "9999-12-31T23:59:59-23:59"}}, 400, ["at:", "366 days ahead"]),
    ("at in 2099", "/channels/http_jobs/jobs",
     {"body": {"body": 1, "at": "2099-01-01T00:00:00Z"}}, 400, ["at:", "366 days ahead"]),
    ("a batch job at the end of time", "/channels/http_jobs/jobs/batch",
     {"body": {"jobs": [{"body": 1, "at": "9999-12-31T23:59:59.5Z"}]}}, 400, ["366 days"]),
    # issue 49 item 2: every error has the {"error": ...} shape
    ("a charset other than utf-8", "/channels/http_jobs/jobs",
     {"raw": b'{"body": 1}', "headers": {"Content-Type": "application/json; charset=latin-1"}},
     415, ["charset", "utf-8", "latin-1"]),
]


@pytest.mark.parametrize(("what", "path", "request_", "status", "words"), BAD_INPUTS,
                         ids=[case[0] for case in BAD_INPUTS])
def test_every_bad_input_gets_its_status_and_one_clear_message(
        call: Call, clients: ClientFactory, settings: Settings, what: str, path: str,
        request_: dict[str, Any], status: int, words: list[str]) -> None:
    reply = call("POST", path, request_.get("body"), raw=request_.get("raw"),
                 headers=request_.get("headers"))
    assert reply.status == status, reply.raw[:500]
    # the documented shape: {"error": ...} (a batch's answer also has each job's result)
    assert set(reply.json) - {"channel", "jobs"} == {"error"}
    assert reply.headers["Content-Type"] == "application/json"
    message = reply.json["error"]
    assert isinstance(message, str) and "\n" not in message
    for word in words:
        assert word in message, message
    # And nothing was sent
    sqs = clients.client("sqs")
    names = sqs.list_queues(QueueNamePrefix=settings.namespace).get("QueueUrls", [])
    assert all(drain(sqs, url) == [] for url in names)


def test_a_batch_job_at_the_end_of_time_is_refused_beside_the_others(call: Call) -> None:
    reply = call("POST", "/channels/http_jobs/jobs/batch",
                 {"jobs": [{"body": 1}, {"body": 2, "at": "9999-12-31T23:59:59-23:59"}]})
    assert reply.status == 207, reply.raw
    assert [job["status"] for job in reply.json["jobs"]] == [202, 400]
    assert "at" in reply.json["jobs"][1]["error"] and "366 days" in reply.json["jobs"][1]["error"]


def test_the_media_type_is_case_insensitive(call: Call, clients: ClientFactory,
                                            settings: Settings) -> None:
    # When a client names JSON in capitals, with a charset (RFC 9110: both case-insensitive)
    reply = call("POST", "/channels/http_jobs/jobs", {"body": {"n": 1}},
                 headers={"Content-Type": "APPLICATION/JSON; charset=UTF-8"})
    batch = call("POST", "/channels/http_jobs/jobs/batch", {"jobs": [{"body": {"n": 2}}]},
                 headers={"Content-Type": "Application/Json"})
    # Then both are accepted and sent
    assert (reply.status, batch.status) == (202, 202), (reply.raw, batch.raw)
    held = drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
    assert sorted(decode(m).body["n"] for m in held) == [1, 2]


@pytest.mark.parametrize(("method", "path", "status", "allow"), [
    ("GET", "/channels/http_jobs/jobs", 405, "POST"),
    ("PUT", "/channels/http_jobs/jobs/batch", 405, "POST"),
    ("DELETE", "/jobs/some-id", 405, "GET"),
    ("GET", "/nowhere", 404, None),
    ("POST", "/channels/http_jobs", 404, None),
])
def test_a_wrong_method_or_route_has_the_error_shape(call: Call, method: str, path: str,
                                                      status: int, allow: str | None) -> None:
    reply = call(method, path, {"body": 1} if method in ("POST", "PUT") else None)
    assert reply.status == status, reply.raw
    assert set(reply.json) == {"error"} and path in reply.json["error"]
    assert reply.headers.get("Allow") == allow


def test_an_idempotency_key_makes_a_batch_once_and_replays_its_answer(
        call: Call, clients: ClientFactory, settings: Settings) -> None:
    batch = {"jobs": [{"body": {"n": 1}}, {"body": {"n": 2}, "priority": "top"},
                      {"body": {"n": 3}}]}
    sends: list[str] = []
    # When the same batch is posted twice with one key
    with injected(clients, "before-send.sqs", lambda event_name, **_: sends.append(event_name)):
        first = call("POST", "/channels/http_jobs/jobs/batch", batch,
                     headers={"Idempotency-Key": "batch-1"})
        again = call("POST", "/channels/http_jobs/jobs/batch", batch,
                     headers={"Idempotency-Key": "batch-1"})
    # Then the second answer is the first one, replayed, and nothing was sent for it
    assert first.status == 207, first.raw
    assert (again.status, again.json) == (first.status, first.json)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert [s.rsplit(".", 1)[-1] for s in sends].count("SendMessageBatch") == 1
    # And the jobs' ids are derived from the key (one job id per job, for the consumer's claim)
    accepted = [job["job_id"] for job in first.json["jobs"] if job["status"] == 202]
    assert accepted == [job_id_for_key("http_jobs", f"batch-1\nbatch\n{i}") for i in (0, 2)]
    held = drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
    assert sorted(decode(m).message_id for m in held) == sorted(accepted)
    # marked for the consumer's claim of the job id for the key's window (two copies SQS
    # delivered run once, issue 49 item 6)
    assert all(decode(m).meta_headers.get(JOB_WINDOW_HEADER) == "86400" for m in held)
    # And another batch under the key is refused, as is the key on the single route
    other = call("POST", "/channels/http_jobs/jobs/batch", {"jobs": [{"body": 9}]},
                 headers={"Idempotency-Key": "batch-1"})
    single = call("POST", "/channels/http_jobs/jobs", {"body": 9},
                  headers={"Idempotency-Key": "batch-1"})
    assert (other.status, single.status) == (422, 422), (other.raw, single.raw)
    assert "Idempotency-Key" in other.json["error"]
    assert drain(clients.client("sqs"), _queue(clients, settings, "http_jobs")) == []


def test_a_batch_key_still_being_accepted_is_409_and_the_batch_is_sent_once(
        call: Call, clients: ClientFactory, settings: Settings) -> None:
    # Given a first batch held inside its SendMessageBatch, when the same key arrives meanwhile
    batch = {"jobs": [{"body": 1}, {"body": 2}]}
    first, second, sends = _again_while_the_first_is_sent(
        call, clients, "SendMessageBatch", "/channels/http_jobs/jobs/batch", batch, "b-slow")
    # Then it is told to come back, the first is accepted, and the batch was sent once
    assert second.status == 409 and int(second.headers["Retry-After"]) > 0, second.raw
    assert set(second.json) == {"error"}
    assert first.status == 202, first.raw
    assert sends == 1
    assert len(drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))) == 2


def test_a_batch_with_a_throttled_job_keeps_no_answer_and_its_retry_sends_only_the_rest(
        serve: Callable[..., LocalApi], clients: ClientFactory, settings: Settings) -> None:
    api = serve(retry_budget_seconds=1.0)
    batch = {"jobs": [{"body": 1, "priority": "high"}, {"body": 2, "priority": "low"}]}
    # Given SQS throttles the low level's sends: the batch is a 207 with a 429 job
    throttle = Throttle(1.0, {"SendMessageBatch", "SendMessage"})

    def low_only(request: Any, **kwargs: Any) -> Any:
        body = request.body.decode() if isinstance(request.body, bytes) else str(request.body)
        return throttle(request, **kwargs) if "http_levels-low" in body else None

    with injected(clients, "before-send.sqs", low_only):
        first = _call(api.url, "POST", "/channels/http_levels/jobs/batch", batch,
                      headers={"Idempotency-Key": "levels-1"})
    assert first.status == 207, first.raw
    assert [job["status"] for job in first.json["jobs"]] == [202, 429]
    # When the client retries with the same key once SQS recovers
    retry = _call(api.url, "POST", "/channels/http_levels/jobs/batch", batch,
                  headers={"Idempotency-Key": "levels-1"})
    # Then both are accepted under their first ids, and the high job was not sent twice
    assert retry.status == 202, retry.raw
    assert retry.json["jobs"][0]["job_id"] == first.json["jobs"][0]["job_id"]
    sqs = clients.client("sqs")
    high = drain(sqs, _queue(clients, settings, "http_levels-high"))
    low = drain(sqs, _queue(clients, settings, "http_levels-low"))
    assert [decode(m).message_id for m in high] == [first.json["jobs"][0]["job_id"]]
    assert [decode(m).message_id for m in low] == [retry.json["jobs"][1]["job_id"]]


def test_the_idempotency_store_failing_before_the_push_is_503_and_nothing_is_sent(
        serve: Callable[..., LocalApi], clients: ClientFactory, settings: Settings) -> None:
    # Given the idempotency table exists, and DynamoDB refuses every PutItem for a while (the
    # function's role lost its grant: AccessDeniedException, not retried)
    api = serve()
    warm = _call(api.url, "POST", "/channels/http_jobs/jobs", {"body": 0},
                 headers={"Idempotency-Key": "warm"})
    assert warm.status == 202, warm.raw
    drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))

    class Body:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def stream(self, **_: Any) -> Any:
            yield self.data

    def broken(request: Any, **_: Any) -> Any:
        return AWSResponse(request.url, 400, {"Content-Type": "application/x-amz-json-1.0"},
                           Body(b'{"__type":"com.amazon.coral.service#AccessDeniedException",'
                                b'"Message":"not authorized to perform: dynamodb:PutItem"}'))

    # When a job comes with an Idempotency-Key
    with injected(clients, "before-send.dynamodb.PutItem", broken):
        reply = _call(api.url, "POST", "/channels/http_jobs/jobs", {"body": 1},
                      headers={"Idempotency-Key": "down-1"})
    # Then it is a 503 with Retry-After in the error shape, and nothing was sent
    assert reply.status == 503, reply.raw
    assert int(reply.headers["Retry-After"]) > 0
    assert set(reply.json) == {"error"} and "idempotency store" in reply.json["error"]
    assert drain(clients.client("sqs"), _queue(clients, settings, "http_jobs")) == []
    # And the key is free: the retry once the store is back is accepted, once
    retry = _call(api.url, "POST", "/channels/http_jobs/jobs", {"body": 1},
                  headers={"Idempotency-Key": "down-1"})
    assert retry.status == 202, retry.raw
    held = drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
    assert [decode(m).message_id for m in held] == [job_id_for_key("http_jobs", "down-1")]


def test_requests_served_at_once_each_get_their_own_answer(
        call: Call, clients: ClientFactory, settings: Settings) -> None:
    # When 40 clients post at once, half with a key, each its own body
    def post(n: int) -> Reply:
        headers = {"Idempotency-Key": f"many-{n}"} if n % 2 else {}
        return call("POST", "/channels/http_jobs/jobs", {"body": {"n": n}}, headers=headers)

    replies: dict[int, Reply] = {}
    threads = [threading.Thread(target=lambda n=n: replies.__setitem__(n, post(n)))
               for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # Then each answer is its own request's: a keyed one has its key's id, and the job under
    # each answered id has that request's body (Powertools' router keeps the current event
    # process-wide: requests routed at once must not read each other's)
    assert sorted(replies) == list(range(40))
    assert all(reply.status == 202 for reply in replies.values()), [
        r.raw for r in replies.values()]
    for n, reply in replies.items():
        if n % 2:
            assert reply.json["job_id"] == job_id_for_key("http_jobs", f"many-{n}"), n
        assert reply.headers["Location"] == f"/jobs/{reply.json['job_id']}"
    held = drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
    bodies = {decode(m).message_id: decode(m).body["n"] for m in held}
    assert bodies == {reply.json["job_id"]: n for n, reply in replies.items()}


def test_the_local_api_answers_within_api_gateways_timeout(call: Call) -> None:
    started = time.monotonic()
    assert call("POST", "/channels/http_jobs/jobs", {"body": 1}).status == 202
    assert time.monotonic() - started < 29


def test_messenger_api_serves_the_readme_calls(settings: Settings, endpoint: str) -> None:
    # Given `messenger api` started as the README's tour starts it (a free port instead of 8000)
    env = {**os.environ, "MESSENGER_NAMESPACE": settings.namespace, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "messenger", "api", "--port", "0", "--channel", "greetings",
         "--status"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+)", banner)
        assert match, banner
        # When the tour's POST and status read are made
        posted = _call(match.group(1), "POST", "/channels/greetings/jobs",
                       {"body": {"name": "Grace"}})
        status = _call(match.group(1), "GET", f"/jobs/{posted.json['job_id']}")
        # Then the job is accepted and its timeline starts with QUEUED
        assert posted.status == 202
        assert status.status == 200 and status.json["events"][0]["event"] == "QUEUED"
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=10)


def test_the_lambda_handler_answers_a_proxy_event(settings: Settings, endpoint: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the deployed function's environment (channels as the construct writes them)
    from lambdas.http_enqueue import handler
    from messenger.api.local import LocalContext, proxy_event

    monkeypatch.setenv("MESSENGER_API_CHANNELS", json.dumps([{"name": "http_jobs"}]))
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    handler.api.cache_clear()
    # When API Gateway invokes it with a POST
    event = proxy_event("POST", "/channels/http_jobs/jobs",
                        [("Content-Type", "application/json")], b'{"body": {"n": 1}}')
    response = handler.handler(event, LocalContext())
    handler.api.cache_clear()
    # Then the job is accepted
    assert response["statusCode"] == 202, response
    assert json.loads(response["body"])["channel"] == "http_jobs"
