"""`ResultStore` against the moto server: a job's final outcome item beside its status records,
its waiters, large results in S3, and the timeline readers that skip the item."""

from __future__ import annotations

import pytest

from messenger import JobFailed
from messenger.jobs.results import (
    INLINE_RESULT_BYTES,
    NOT_SERIALIZABLE,
    FinalOutcome,
    Outcome,
    ResultStore,
)
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.offload import RESULTS_PREFIX


@pytest.fixture
def store(settings, clients) -> ResultStore:
    results = ResultStore(clients, settings)
    results.ensure_table()
    return results


def test_a_finished_job_reads_back_with_its_result(store):
    # Given a job that completed with a result
    outcome = FinalOutcome.completed("job-1", "orders", {"total": 3, "items": ["a", "b"]},
                                     at=1_700_000_000.5)
    assert store.finish(outcome) == frozenset()
    # Then it reads back the same, alone or in a batch
    assert store.get("job-1") == outcome
    assert store.get_many(["job-1", "job-2"]) == {"job-1": outcome}
    assert store.get("job-2") is None


def test_a_failed_outcome_raises_job_failed_with_its_fields(store):
    outcome = FinalOutcome("job-1", "orders", Outcome.DEAD_LETTERED, 1.0, error_type="KeyError",
                           error="'sku'", reason="failed: attempts used up (3 of 3)")
    store.finish(outcome)
    found = store.get("job-1")
    assert found == outcome and not found.ok
    failure = found.failure()
    assert isinstance(failure, JobFailed)
    assert (failure.outcome, failure.error_type, failure.error, failure.reason) == (
        "dead_lettered", "KeyError", "'sku'", "failed: attempts used up (3 of 3)")


def test_a_later_outcome_overwrites_an_earlier_one(store):
    # Given a job dead-lettered, then requeued and completed
    store.finish(FinalOutcome("job-1", "orders", Outcome.DEAD_LETTERED, 1.0, error="boom",
                              error_type="ValueError", reason="unrecoverable: ValueError: boom"))
    store.finish(FinalOutcome.completed("job-1", "orders", [1, 2], at=2.0))
    # Then only the completion is left: no error fields of the first
    assert store.get("job-1") == FinalOutcome("job-1", "orders", Outcome.COMPLETED, 2.0,
                                              result=[1, 2])


def test_waiters_registered_before_the_outcome_are_returned_by_finish(store):
    # Given two waiters on a job that has not finished
    assert store.add_waiter("job-1", "group#g1", 3600) is None
    assert store.add_waiter("job-1", "job#j2", 3600) is None
    assert store.add_waiter("job-1", "job#j2", 3600) is None  # a retry: the same set
    assert store.get("job-1") is None  # waiters only: not final
    assert store.waiters("job-1") == frozenset({"group#g1", "job#j2"})
    assert store.waiters("job-9") == frozenset()
    # When it finishes, the finish sees both
    outcome = FinalOutcome.completed("job-1", "orders", "done", at=5.0)
    assert store.finish(outcome) == frozenset({"group#g1", "job#j2"})
    # And a waiter that comes later gets the outcome instead
    assert store.add_waiter("job-1", "job#j3", 3600) == outcome
    store.remove_waiter("job-1", "job#j3")
    store.remove_waiter("job-9", "job#j3")  # nothing there: no item made
    assert store.finish(outcome) == frozenset({"group#g1", "job#j2"})
    assert store.get_many(["job-9"]) == {}


def test_a_result_larger_than_the_inline_limit_goes_to_s3(store, clients):
    # Given a result of more than INLINE_RESULT_BYTES encoded
    big = {"rows": ["x" * 1000 for _ in range(INLINE_RESULT_BYTES // 1000 + 10)]}
    store.finish(FinalOutcome.completed("job-big", "reports", big, at=3.0))
    # Then the item holds a pointer under the results prefix, and get resolves it
    item = clients.client("dynamodb").get_item(
        TableName=store.table, Key={"message_id": {"S": "job-big"}, "sk": {"S": "~final"}},
        ConsistentRead=True)["Item"]
    assert "result" not in item and RESULTS_PREFIX in item["result_s3"]["S"]
    assert store.get("job-big").result == big
    assert store.get_many(["job-big"])["job-big"].result == big


def test_a_result_json_cannot_encode_completes_without_it():
    outcome = FinalOutcome.completed("job-1", "orders", {1, 2})
    assert outcome.ok and outcome.result is None
    assert outcome.error == f"{NOT_SERIALIZABLE}: set"
    assert FinalOutcome.completed("j", "c", float("nan")).error == f"{NOT_SERIALIZABLE}: float"


def test_the_timeline_skips_the_final_item(store, settings, clients):
    # Given a job with status records, its outcome and a waiter on it
    status = StatusStore(clients, settings)
    status.record(StatusRecord("job-1", StatusEvent.QUEUED, "orders", at=1.0))
    status.record(StatusRecord("job-1", StatusEvent.COMPLETED, "orders", at=2.0))
    status.close()
    store.add_waiter("job-1", "job#j2", 3600)
    store.finish(FinalOutcome.completed("job-1", "orders", 7, at=2.0))
    # Then the timeline holds the records only
    assert [r.event for r in status.timeline("job-1")] == [StatusEvent.QUEUED,
                                                            StatusEvent.COMPLETED]
    store.add_waiter("job-2", "job#j3", 3600)  # a waiter-only item, no record
    assert status.timeline("job-2") == []
