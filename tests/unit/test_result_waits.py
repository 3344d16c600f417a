"""`ResultWaits` (what `Producer.result` runs) with a store and a clock of the test's own: the
backoff between reads, each outcome's answer, bad arguments named."""

from __future__ import annotations

from typing import Any

import pytest

from messenger import JobFailed
from messenger.jobs.results import FinalOutcome, Outcome
from messenger.produce.results import ResultWaits


class Store:
    """Answers None until `after` reads, then `outcome`."""

    def __init__(self, outcome: FinalOutcome | None = None, after: int = 0) -> None:
        self.outcome = outcome
        self.after = after
        self.reads = 0

    def get(self, job_id: str) -> FinalOutcome | None:
        self.reads += 1
        return self.outcome if self.reads > self.after else None


def waits(store: Store, draw: float = 1.0) -> tuple[ResultWaits, list[float]]:
    clock = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    store_any: Any = store
    return ResultWaits(store_any, clock=lambda: clock[0], sleep=sleep,
                       draw=lambda: draw), slept


def test_the_reads_back_off_from_a_tenth_of_a_second_to_five_with_jitter():
    # Given a job that completes at the 10th read
    done = FinalOutcome.completed("j", "c", {"ok": True})
    reader, slept = waits(Store(done, after=9))
    assert reader.result("j") == {"ok": True}
    # Then the waits double from 0.1 s and stop growing at 5 s
    assert slept == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0])
    # and the jitter draws each between half and all of its value
    reader, slept = waits(Store(done, after=3), draw=0.0)
    reader.result("j")
    assert slept == pytest.approx([0.05, 0.1, 0.2])


@pytest.mark.parametrize("outcome", [Outcome.DEAD_LETTERED, Outcome.CANCELLED, Outcome.DELETED,
                                     Outcome.EXPIRED])
def test_every_outcome_but_completed_raises_job_failed(outcome):
    reader, _ = waits(Store(FinalOutcome("j", "c", outcome, 1.0, reason="why")))
    with pytest.raises(JobFailed) as failed:
        reader.result("j", timeout=0)
    assert (failed.value.job_id, failed.value.outcome, failed.value.reason) == (
        "j", outcome.value, "why")


def test_a_timeout_never_waits_past_itself():
    reader, slept = waits(Store())
    with pytest.raises(TimeoutError, match="job j has no final outcome after 1 s"):
        reader.result("j", timeout=1)
    assert sum(slept) == pytest.approx(1.0)
    reader, slept = waits(Store())
    with pytest.raises(TimeoutError):
        reader.result("j", timeout=0)
    assert slept == []


@pytest.mark.parametrize("timeout", [-1, float("nan"), True, "10"])
def test_a_bad_timeout_is_named(timeout):
    reader, _ = waits(Store())
    with pytest.raises(ValueError, match="timeout must be None .* or a number of seconds >= 0"):
        reader.result("j", timeout=timeout)


@pytest.mark.parametrize("job_id", ["", None, 7])
def test_a_bad_job_id_is_named(job_id):
    reader, _ = waits(Store())
    with pytest.raises(ValueError, match="job_id must be"):
        reader.result(job_id, timeout=0)
