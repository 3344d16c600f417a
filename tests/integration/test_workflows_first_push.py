"""The first push of a namespace may be a job that waits: no status table, no workflows table
yet (auto provisioning, a fresh local endpoint). It is held, not refused."""

from __future__ import annotations

from messenger.jobs.results import ResultStore
from messenger.jobs.workflows import State, Workflows
from tests.integration.test_workflows import producer_of


def test_a_job_that_waits_can_be_the_namespaces_first_push(settings, clients):
    # Given a namespace where nothing was ever pushed or consumed (no status table)
    producer = producer_of(settings, clients, "steps")
    # When its first push waits on a job that has not run
    job = producer.push({"report": 1}, depends_on=["fetch-1"])
    # Then it is held, registered on the job it waits for
    flows = Workflows(clients, settings)
    assert flows.dependencies_of(job).state is State.HELD
    assert [d.job_id for d in flows.dependents_of("fetch-1")] == [job]
    assert ResultStore(clients, settings).get("fetch-1") is None
