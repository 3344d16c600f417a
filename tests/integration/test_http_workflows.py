"""Results and dependencies over HTTP (issue 52): `depends_on` / `on_dependency_failure` in a
job's JSON on the single and batch routes, and `GET /jobs/{id}` showing a job's result or error,
its dependencies and its dependents. `JobApi` served by `LocalApi` on a free loopback port,
producing to the moto server; real consumers run the jobs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from messenger import Unrecoverable
from messenger.api.app import JobApi
from messenger.api.channels import ApiChannel
from messenger.api.local import LocalApi
from messenger.aws import ClientFactory
from messenger.settings import Settings
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    running,
    runtime,
    wait_until,
)
from tests.integration.test_http_api import Call, _call

CHANNELS = {
    "http_results": ApiChannel("http_results", track_status=True),
    "http_reports": ApiChannel("http_reports", track_status=True),
}


class ResultsConsumer(Recording):
    """Returns {"doubled": n * 2}; a body {"fail": "..."} fails for good. Each job waits for
    `gate` first (set: they run at once)."""

    channel = "http_results"
    track_status = True
    keep_results = True
    gate = threading.Event()

    def handler(self, message: Any) -> Any:
        assert self.gate.wait(30)
        super().handler(message)
        if isinstance(message.body, dict) and "fail" in message.body:
            raise Unrecoverable(message.body["fail"])
        return {"doubled": message.body["n"] * 2}


class ReportsConsumer(Recording):
    """Records each job with what it depended on."""

    channel = "http_reports"
    track_status = True
    keep_results = True

    def handler(self, message: Any) -> Any:
        super().handler(message)
        return {"seen": sorted(message.dependencies)}


@pytest.fixture(autouse=True)
def open_gate() -> Iterator[None]:
    ResultsConsumer.gate.set()
    yield
    ResultsConsumer.gate.set()


@pytest.fixture
def call(settings: Settings, clients: ClientFactory) -> Iterator[Call]:
    api = LocalApi(JobApi(CHANNELS, settings, clients)).start()
    try:
        yield lambda *args, **kwargs: _call(api.url, *args, **kwargs)
    finally:
        api.stop()


def _final(call: Call, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
    """The job's GET answer once it has a final outcome."""
    reply = wait_until(lambda: (r := call("GET", f"/jobs/{job_id}")).status == 200
                       and "outcome" in r.json and r, timeout=timeout)
    return reply.json


# -- request checks -----------------------------------------------------------------------------
@pytest.mark.parametrize("job, field, says", [
    ({"body": 1, "depends_on": []}, "depends_on", "at least 1 item"),
    ({"body": 1, "depends_on": "abc"}, "depends_on", "valid list"),
    ({"body": 1, "depends_on": ["ok", "has space"]}, "depends_on.1", "a job id must be 1 to 128"),
    ({"body": 1, "depends_on": [7]}, "depends_on.0", "valid string"),
    ({"body": 1, "depends_on": [f"j{i}" for i in range(101)]}, "depends_on", "at most 100"),
    ({"body": 1, "depends_on": ["a"], "on_dependency_failure": "skip"},
     "on_dependency_failure", "'cancel' or 'run'"),
    ({"body": 1, "on_dependency_failure": "run"}, "on_dependency_failure", "only with depends_on"),
])
def test_a_bad_dependency_field_is_400_naming_it_on_both_routes(
        call: Call, job: dict[str, Any], field: str, says: str) -> None:
    # When a job carries a bad depends_on or on_dependency_failure
    single = call("POST", "/channels/http_results/jobs", job)
    # Then the single route refuses it, the line naming the field and what it takes
    assert single.status == 400, single.raw
    assert single.json["error"].startswith(f"{field}: ") and says in single.json["error"]
    # And in a batch it is that job's 400, beside a good job that is accepted
    batch = call("POST", "/channels/http_results/jobs/batch", {"jobs": [{"body": {"n": 1}}, job]})
    assert batch.status == 207, batch.raw
    good, bad = batch.json["jobs"]
    assert good["status"] == 202
    assert bad["status"] == 400 and bad["error"].startswith(f"{field}: ") and \
        says in bad["error"]


# -- results ------------------------------------------------------------------------------------
def test_a_completed_job_shows_its_result_and_a_failed_one_its_error(
        call: Call, running: Any) -> None:  # noqa: F811
    # Given a consumer that keeps results
    run = running(ResultsConsumer)
    wait_until(lambda: run.consumer.resources, timeout=120)
    # When one job completes and another fails for good
    done = call("POST", "/channels/http_results/jobs", {"body": {"n": 21}}).json["job_id"]
    failed = call("POST", "/channels/http_results/jobs", {"body": {"fail": "no such row"}}
                  ).json["job_id"]
    # Then GET /jobs/{id} shows the first's result
    answer = _final(call, done)
    assert answer["outcome"] == "completed" and answer["result"] == {"doubled": 42}
    assert "error" not in answer
    # And the second's error: what Producer.result raises (type, message, reason)
    answer = _final(call, failed)
    assert answer["outcome"] == "dead_lettered" and "result" not in answer
    assert answer["error"]["type"] == "Unrecoverable"
    assert answer["error"]["message"] == "no such row"
    assert answer["error"]["reason"].startswith("unrecoverable")


# -- dependencies -------------------------------------------------------------------------------
def test_a_job_posted_with_depends_on_runs_after_them_and_each_side_shows_the_other(
        call: Call, running: Any) -> None:  # noqa: F811
    # Given two jobs on the results channel, not run yet (its consumer waits at the gate)
    ResultsConsumer.gate.clear()
    results, reports = running(ResultsConsumer), running(ReportsConsumer)
    wait_until(lambda: results.consumer.resources and reports.consumer.resources,
               timeout=120)  # provisioned
    first, second = (call("POST", "/channels/http_results/jobs", {"body": {"n": n}}
                          ).json["job_id"] for n in (1, 2))
    # When a report job is posted depending on both, and one in a batch on the first only
    report = call("POST", "/channels/http_reports/jobs",
                  {"body": "report", "depends_on": [first, second]})
    assert report.status == 202, report.raw
    batch = call("POST", "/channels/http_reports/jobs/batch", {"jobs": [
        {"body": "batch report", "depends_on": [first], "on_dependency_failure": "run"}]})
    assert batch.status == 202, batch.raw
    report_id, batch_id = report.json["job_id"], batch.json["jobs"][0]["job_id"]
    # Then the report job waits: its answer lists what it waits for, nothing of it ran
    held = wait_until(lambda: (r := call("GET", f"/jobs/{report_id}")).status == 200 and r,
                      timeout=60)
    assert held.json["dependencies"]["pending"] == sorted([first, second])
    assert held.json["dependencies"]["on_dependency_failure"] == "cancel"
    assert reports.consumer.handled == []
    # And each dependency names what waits on it
    dependents = call("GET", f"/jobs/{first}").json["dependents"]
    assert sorted(d["job_id"] for d in dependents) == sorted([report_id, batch_id])
    # When the dependencies run
    ResultsConsumer.gate.set()
    # Then the report runs once both completed, with their results
    answer = _final(call, report_id)
    assert answer["outcome"] == "completed" and answer["result"] == {
        "seen": sorted([first, second])}
    assert answer["dependencies"]["pending"] == []
    assert answer["dependencies"]["done"][first]["outcome"] == "completed"
    assert _final(call, batch_id)["result"] == {"seen": [first]}
