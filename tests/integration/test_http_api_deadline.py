"""One deadline per API request (issue 49 items 8 and 9), over real HTTP and real sockets.

AWS is made slow or absent at the TCP level, as it fails: `SlowEndpoint`, a proxy in front of
the moto server that passes each request on at once and holds its response 7 s (the service
applies the call, its answer comes late); a dead port (connection refused); a host that
accepts connections and never answers (tests.faults.Blackhole). The API runs on `LocalApi`
(29 s per request, as API Gateway gives it) and a stdlib client measures each answer."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from messenger.api.app import JobApi, job_id_for_key
from messenger.api.channels import ApiChannel
from messenger.api.local import LocalApi
from messenger.aws import ClientFactory
from messenger.settings import Settings
from tests.faults import Blackhole, injected
from tests.integration.helpers import decode, drain
from tests.integration.test_http_api import Reply, _call, _queue

#: API Gateway's integration timeout: every answer must come before it.
GATEWAY_SECONDS = 29.0
CHANNELS = {"http_jobs": ApiChannel("http_jobs", track_status=True),
            "http_cold": ApiChannel("http_cold")}


class SlowEndpoint:
    """A TCP proxy to `upstream` (host, port): each request goes on at once, its response is
    held until `delay` seconds after the request came (set `delay` at any time)."""

    def __init__(self, upstream: tuple[str, int], delay: float = 0.0) -> None:
        self.upstream, self.delay = upstream, delay
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            asked = [time.monotonic()]
            threading.Thread(target=self._pump, args=(client, server, asked, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, asked, True),
                             daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, asked: list[float],
              answers: bool) -> None:
        try:
            while data := source.recv(65536):
                if answers:  # hold the response until `delay` after its request came
                    time.sleep(max(0.0, asked[0] + self.delay - time.monotonic()))
                else:
                    asked[0] = time.monotonic()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self._server.close()
        for sock in self._sockets:
            sock.close()


@pytest.fixture
def serve_with(settings: Settings) -> Iterator[Callable[[ClientFactory], LocalApi]]:
    started: list[LocalApi] = []

    def start(clients: ClientFactory) -> LocalApi:
        started.append(LocalApi(JobApi(CHANNELS, settings, clients)).start())
        return started[-1]

    yield start
    for api in started:
        api.stop()


def _held(clients: ClientFactory, settings: Settings, channel: str) -> list[str]:
    """The job ids in a channel's queue (taken out); none if the queue was never made."""
    sqs = clients.client("sqs")
    try:
        url = _queue(clients, settings, channel)
    except sqs.exceptions.QueueDoesNotExist:
        return []
    return [decode(m).message_id for m in drain(sqs, url)]


def _timed(base: str, *args: Any, **kwargs: Any) -> tuple[Reply, float]:
    started = time.monotonic()
    reply = _call(base, *args, **kwargs)
    return reply, time.monotonic() - started


@pytest.mark.parametrize("store", ["dead port", "host that never answers"])
def test_the_idempotency_store_down_is_a_503_with_retry_after_within_the_deadline(
        store: str, serve_with: Callable[[ClientFactory], LocalApi], clients: ClientFactory,
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given DynamoDB (the idempotency table) is unreachable while SQS works
    if store == "dead port":
        with socket.create_server(("127.0.0.1", 0)) as probe:
            dead = f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed: connection refused
        hole = None
    else:
        hole = Blackhole()
        dead = hole.url
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", dead)
    try:
        api = serve_with(ClientFactory("us-east-1"))
        # When a job comes with an Idempotency-Key
        reply, took = _timed(api.url, "POST", "/channels/http_jobs/jobs", {"body": 1},
                             headers={"Idempotency-Key": f"down-{store}"})
    finally:
        if hole is not None:
            hole.close()
    # Then it is a 503 with Retry-After, in the error shape, before API Gateway's timeout
    assert reply.status == 503, reply.raw
    assert int(reply.headers["Retry-After"]) > 0
    assert set(reply.json) == {"error"} and "not accepted" in reply.json["error"]
    assert took < GATEWAY_SECONDS, took
    # And nothing was sent
    assert _held(clients, settings, "http_jobs") == []


def test_records_after_the_send_never_turn_an_accepted_job_into_a_5xx(
        serve_with: Callable[[ClientFactory], LocalApi], clients: ClientFactory,
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a channel that records status, its queue made, and DynamoDB that never answers
    api = serve_with(ClientFactory("us-east-1"))
    warm = _call(api.url, "POST", "/channels/http_jobs/jobs", {"body": 0})
    assert warm.status == 202, warm.raw
    drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
    hole = Blackhole()
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", hole.url)
    try:
        api = serve_with(ClientFactory("us-east-1"))
        # When a job is posted (SQS accepts it; its QUEUED record cannot be written)
        reply, took = _timed(api.url, "POST", "/channels/http_jobs/jobs", {"body": 1})
    finally:
        hole.close()
    # Then it is a 202 before API Gateway's timeout, and the job is in its queue
    assert reply.status == 202, reply.raw
    assert took < GATEWAY_SECONDS, took
    held = drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
    assert [decode(m).message_id for m in held] == [reply.json["job_id"]]


def test_with_every_aws_call_answering_after_7_s_every_answer_is_in_time_and_no_accepted_job_is_a_5xx(  # noqa: E501
        serve_with: Callable[[ClientFactory], LocalApi], clients: ClientFactory,
        settings: Settings, endpoint: str) -> None:
    host, port = endpoint.removeprefix("http://").split(":")
    slow = SlowEndpoint((host, int(port.rstrip("/"))))
    try:
        api = serve_with(ClientFactory("us-east-1", endpoint_url=slow.url))
        # Given the API has served once (queue, tables and queue URL known), http_cold never
        warm = _call(api.url, "POST", "/channels/http_jobs/jobs", {"body": "warm"},
                     headers={"Idempotency-Key": "warm"})
        warm_batch = _call(api.url, "POST", "/channels/http_jobs/jobs/batch",
                           {"jobs": [{"body": "warm"}]}, headers={"Idempotency-Key": "warm-b"})
        assert (warm.status, warm_batch.status) == (202, 202), (warm.raw, warm_batch.raw)
        drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
        # When every AWS call answers 7 s after it is made
        slow.delay = 7.0
        requests: list[tuple[str, str, Any, dict[str, str]]] = [
            ("POST", "/channels/http_jobs/jobs", {"body": "keyed"}, {"Idempotency-Key": "k1"}),
            ("POST", "/channels/http_jobs/jobs", {"body": "plain"}, {}),
            ("POST", "/channels/http_jobs/jobs/batch",
             {"jobs": [{"body": "kb0"}, {"body": "kb1"}]}, {"Idempotency-Key": "kb"}),
            ("POST", "/channels/http_jobs/jobs/batch",
             {"jobs": [{"body": "b0"}, {"body": "b1"}]}, {}),
            ("POST", "/channels/http_cold/jobs", {"body": "cold"}, {"Idempotency-Key": "c1"}),
            ("POST", "/channels/http_cold/jobs", {"body": "cold-plain"}, {}),
            ("GET", f"/jobs/{warm.json['job_id']}", None, {}),
        ]
        answers: list[tuple[Reply, float] | None] = [None] * len(requests)

        def ask(index: int) -> None:
            method, path, body, headers = requests[index]
            answers[index] = _timed(api.url, method, path, body, headers=headers)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(GATEWAY_SECONDS + 30)
        slow.delay = 0.0
        # Then every request was answered before API Gateway's 29 s
        assert all(answer is not None for answer in answers), answers
        done = [answer for answer in answers if answer is not None]
        assert max(took for _, took in done) < GATEWAY_SECONDS, [t for _, t in done]
        # And every answer is an answer: 2xx, or 503 with Retry-After in the error shape
        for reply, _ in done:
            assert reply.status in (200, 202, 207, 503), reply.raw
            if reply.status == 503:
                assert int(reply.headers["Retry-After"]) > 0 and "error" in reply.json
        # And every job SQS holds was answered 2xx (no accepted job got a 5xx), and vice versa
        # the requests' work left after their answers (refused calls, calls on their way) ends
        finish_by = time.monotonic() + 60
        while any(t.name == "messenger-api-request" for t in threading.enumerate()):
            assert time.monotonic() < finish_by, "a request's worker still runs after 60 s"
            time.sleep(0.2)
        accepted: dict[str, set[str]] = {"http_jobs": set(), "http_cold": set()}
        for (method, path, _, _), (reply, _) in zip(requests, done, strict=True):
            if method != "POST" or reply.status >= 300:
                continue
            channel = path.split("/")[2]
            if path.endswith("/batch"):
                accepted[channel] |= {job["job_id"] for job in reply.json["jobs"]
                                      if job["status"] == 202}
            else:
                accepted[channel].add(reply.json["job_id"])
        for channel, ids in accepted.items():
            held = set(_held(clients, settings, channel))
            assert held == ids, (channel, held, ids, [(r.status, r.raw[:200]) for r, _ in done])
        # And the keyed jobs that were accepted carry the ids derived from their keys
        keyed = done[0][0]
        if keyed.status == 202:
            assert keyed.json["job_id"] == job_id_for_key("http_jobs", "k1")
        # figures for the report
        print("answers:", [(r.status, round(t, 1)) for r, t in done])
    finally:
        slow.close()


class TenSeconds:
    """A Lambda context with 10 s left (a function whose timeout is near)."""

    def __init__(self) -> None:
        self._deadline = time.monotonic() + 10.0

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def test_a_late_answer_says_which_jobs_sqs_accepted(settings: Settings,
                                                    clients: ClientFactory) -> None:
    from messenger.api.local import LocalContext, proxy_event

    api = JobApi(CHANNELS, settings, clients)

    def post(path: str, body: bytes, key: str, context: Any) -> tuple[dict[str, Any], float]:
        event = proxy_event("POST", path, [("Content-Type", "application/json"),
                                           ("Idempotency-Key", key)], body)
        started = time.monotonic()
        return api.handle(event, context), time.monotonic() - started

    warm, _ = post("/channels/http_jobs/jobs", b'{"body": 0}', "warm", LocalContext())
    assert warm["statusCode"] == 202, warm
    drain(clients.client("sqs"), _queue(clients, settings, "http_jobs"))
    # Given the idempotency record's success write (after the send) hangs
    release = threading.Event()
    with injected(clients, "before-send.dynamodb.UpdateItem", lambda **_: release.wait(60)):
        # When a keyed job and a keyed batch come with 10 s left to the function
        single, single_took = post("/channels/http_jobs/jobs", b'{"body": 1}', "late-1",
                                   TenSeconds())
        batch, batch_took = post("/channels/http_jobs/jobs/batch",
                                 b'{"jobs": [{"body": 2}, {"body": 3, "priority": "x"}]}',
                                 "late-b", TenSeconds())
        release.set()
    # Then both are answered at their deadline (9 s), as the jobs SQS accepted: 202 with their
    # ids, the batch's invalid job still its 400
    assert 8.5 < single_took < 10 and 8.5 < batch_took < 10, (single_took, batch_took)
    assert single["statusCode"] == 202, single
    assert json.loads(single["body"])["job_id"] == job_id_for_key("http_jobs", "late-1")
    assert single["headers"]["Location"].endswith(job_id_for_key("http_jobs", "late-1"))
    assert batch["statusCode"] == 207, batch
    jobs = json.loads(batch["body"])["jobs"]
    assert [job["status"] for job in jobs] == [202, 400]
    assert jobs[0]["job_id"] == job_id_for_key("http_jobs", "late-b\nbatch\n0")
    assert "priority" in jobs[1]["error"]
    assert sorted(_held(clients, settings, "http_jobs")) == sorted(
        [job_id_for_key("http_jobs", "late-1"), jobs[0]["job_id"]])
