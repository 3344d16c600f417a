"""What a job's readers show beyond its status records: its final outcome (result or error),
what it waits for, what waits on it, and a group's progress (issue 52).

One shape for `GET /jobs/{id}` (`messenger.api`) and the dashboard's job and group pages, made
from the public reads of `messenger.jobs.results.ResultStore` and
`messenger.jobs.workflows.Workflows`; every field is JSON. A namespace without the tables (no
channel keeps results, nothing ever waited) answers nothing: the job simply has none of it.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, error_code
from messenger.errors import ChannelNotFound
from messenger.jobs.results import FinalOutcome, ResultStore
from messenger.jobs.workflows import Counted, Dependent, GroupProgress, Waiting, Workflows
from messenger.settings import Settings


def outcome_fields(final: FinalOutcome) -> dict[str, Any]:
    """`outcome` and `finished_at`, then `result` for a completed job, and `error` (`type`,
    `message`, `reason`: those set; what `Producer.result` raises as JobFailed) for one that
    failed, or completed with a return value JSON could not encode."""
    answer: dict[str, Any] = {"outcome": final.outcome.value, "finished_at": final.at}
    if final.ok:
        answer["result"] = final.result
    error = {name: value for name, value in (("type", final.error_type),
                                             ("message", final.error),
                                             ("reason", final.reason)) if value}
    if error:
        answer["error"] = error
    return answer


def counted_fields(counted: Counted) -> dict[str, Any]:
    """One dependency's outcome as the barrier counted it: `outcome`, `at`, `reason` if any."""
    answer: dict[str, Any] = {"outcome": counted.outcome, "at": counted.at}
    if counted.reason:
        answer["reason"] = counted.reason
    return answer


def dependencies_fields(waiting: Waiting) -> dict[str, Any]:
    """What a held job (or a group's callback) waits for: `state` (HELD, RELEASING, RELEASED,
    CANCELLED, EXPIRED), `on_dependency_failure`, `jobs` (every dependency, in order),
    `pending` (not final yet, sorted), `done` (each counted one's outcome), `late` (outcomes
    after one was counted), and `group_id` for a group's callback, `reason` when closed."""
    answer: dict[str, Any] = {
        "state": waiting.state.value, "on_dependency_failure": waiting.policy,
        "jobs": list(waiting.dependencies), "pending": sorted(waiting.pending),
        "done": {job: counted_fields(c) for job, c in waiting.done.items()},
    }
    if waiting.late:
        answer["late"] = {job: counted_fields(c) for job, c in waiting.late.items()}
    if waiting.is_group:
        answer["group_id"] = waiting.id.split("#", 1)[1]
    if waiting.reason:
        answer["reason"] = waiting.reason
    return answer


def dependent_fields(dependent: Dependent) -> dict[str, Any]:
    """A job waiting on this one: `job_id`, and `group_id` when it is a group's callback."""
    answer: dict[str, Any] = {"job_id": dependent.job_id}
    if dependent.group_id:
        answer["group_id"] = dependent.group_id
    return answer


def group_fields(progress: GroupProgress) -> dict[str, Any]:
    """A group's progress: `group_id`, `members`, `total`, `finished`, `failed`, `state` (of
    its callback), `then_job` ('' without one), `sent` (every member pushed), `late` (members
    that finished again after being counted) and `outcomes` (member → counted outcome)."""
    return {
        "group_id": progress.group_id, "members": list(progress.members),
        "total": len(progress.members), "finished": progress.finished,
        "failed": progress.failed, "state": progress.state.value,
        "then_job": progress.then_job, "sent": progress.sent, "late": list(progress.late),
        "outcomes": {job: counted_fields(c) for job, c in progress.outcomes.items()},
    }


class JobReader:
    """Reads what `outcome_fields` and friends show, for one namespace (`settings`).

    results, workflows: the stores to read (default ones of their own)."""

    def __init__(self, clients: ClientFactory, settings: Settings,
                 results: ResultStore | None = None, workflows: Workflows | None = None) -> None:
        self.results = results or ResultStore(clients, settings)
        self.workflows = workflows or Workflows(clients, settings, results=self.results)

    def job(self, job_id: str) -> dict[str, Any]:
        """The job's `outcome` fields (when final), `dependencies` (when it waited on others)
        and `dependents` (when anything waits on it): each left out when there is none."""
        answer: dict[str, Any] = {}
        final = _absent_as_none(lambda: self.results.get(job_id))
        if final is not None:
            answer.update(outcome_fields(final))
        waiting = _absent_as_none(lambda: self.workflows.dependencies_of(job_id))
        if waiting is not None:
            answer["dependencies"] = dependencies_fields(waiting)
        dependents = _absent_as_none(lambda: self.workflows.dependents_of(job_id)) or []
        if dependents:
            answer["dependents"] = [dependent_fields(d) for d in dependents]
        return answer

    def held(self, job_id: str) -> Waiting | None:
        """The job's waiting item (a held job has no status record before its release)."""
        return _absent_as_none(lambda: self.workflows.dependencies_of(job_id))

    def group(self, group_id: str) -> dict[str, Any] | None:
        """The group's `group_fields`, None when there is no such group."""
        progress = _absent_as_none(lambda: self.workflows.group(group_id))
        return None if progress is None else group_fields(progress)


def _absent_as_none(read: Any) -> Any:
    """`read()`, or None when its table does not exist (nothing was ever recorded there)."""
    try:
        return read()
    except ChannelNotFound:
        return None
    except ClientError as error:
        if error_code(error) == "ResourceNotFoundException":
            return None
        raise


__all__ = ["JobReader", "counted_fields", "dependencies_fields", "dependent_fields",
           "group_fields", "outcome_fields"]
