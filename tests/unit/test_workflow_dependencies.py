"""What a released job carries of its dependencies: the header's JSON, within a size budget,
and `message.dependencies` read back from it."""

from __future__ import annotations

import json

from messenger import JobFailed, Message, ResultOmitted
from messenger.jobs.results import FinalOutcome, Outcome
from messenger.jobs.workflows import Counted, dependencies_text
from messenger.message import DEPENDENCIES_HEADER, decode_dependencies


def completed(job_id: str, value) -> tuple[str, FinalOutcome, Counted]:
    outcome = FinalOutcome.completed(job_id, "c", value, at=1.0)
    return job_id, outcome, Counted.of(outcome)


def failed(job_id: str, reason: str = "attempts used up") -> tuple[str, FinalOutcome, Counted]:
    outcome = FinalOutcome(job_id, "c", Outcome.DEAD_LETTERED, 1.0, error_type="ValueError",
                           error="bad", reason=reason)
    return job_id, outcome, Counted.of(outcome)


def carried(text: str) -> dict:
    return Message({}, meta_headers={DEPENDENCIES_HEADER: text}).dependencies


def test_results_and_failures_round_trip():
    deps = carried(dependencies_text([completed("a", {"x": [1]}), failed("b")], 10_000))
    assert deps["a"] == {"x": [1]}
    assert isinstance(deps["b"], JobFailed)
    assert (deps["b"].outcome, deps["b"].error_type, deps["b"].error, deps["b"].reason) == (
        "dead_lettered", "ValueError", "bad", "attempts used up")


def test_the_largest_results_are_omitted_first_to_fit():
    text = dependencies_text([completed("big", "x" * 5000), completed("small", 1)], 1000)
    assert len(text.encode()) <= 1000
    assert carried(text) == {"big": ResultOmitted("big"), "small": 1}


def test_failures_lose_their_texts_before_the_message_would_not_fit():
    entries = [failed(f"j{n}", reason="r" * 400) for n in range(20)]
    text = dependencies_text(entries, 2500)
    assert len(text.encode()) <= 2500
    assert all(isinstance(v, JobFailed) and v.outcome == "dead_lettered"
               for v in carried(text).values())


def test_an_outcome_that_changed_since_it_was_counted_is_carried_as_counted():
    # Given a member counted dead-lettered, then requeued and completed before the release
    job_id, first, counted = failed("m")
    later = FinalOutcome.completed("m", "c", 5, at=2.0)
    deps = carried(dependencies_text([(job_id, later, counted)], 10_000))
    assert isinstance(deps["m"], JobFailed) and deps["m"].outcome == "dead_lettered"


def test_a_message_without_the_header_or_with_a_foreign_one_has_no_dependencies():
    assert Message({}).dependencies == {}
    assert decode_dependencies({DEPENDENCIES_HEADER: "not json"}) == {}
    assert decode_dependencies({DEPENDENCIES_HEADER: json.dumps([1, 2])}) == {}
