"""Cancel scheduled jobs in bulk (the dashboard's Cancel of the ticked jobs), with one answer
per job.

    report = cancel_scheduled(clients, settings, ["3f2a...", "9b1c..."], "nightly",
                              actor="ada@example.com")
    report.result        # 'done' (all cancelled), 'partial' or 'failed'
    for outcome in report.outcomes:
        print(outcome.job_id, outcome.cancelled, outcome.text)

Each job is cancelled as `messenger schedules cancel` cancels one
(`messenger.jobs.schedule_store.ScheduleStore.cancel`: its claim taken on every consumer
channel, then its schedule deleted), in the order given, each id once. A job that is unknown,
already fired or already cancelled, or too late (a consumer took a firing of it first) is
answered as such and the rest go on. Any other error (AWS past the retry budget, a refused
permission) stops the batch there: that job is answered with the error (it may be marked
cancelled already: cancelling it again finishes the job) and the ones after it are answered
"not attempted", so one unreachable endpoint costs one retry budget, not one per job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory
from messenger.errors import MessengerError
from messenger.jobs.schedule_store import ScheduledJob, ScheduleNotFound, ScheduleStore, TooLate
from messenger.settings import Settings

__all__ = ["CancelOutcome", "CancelReport", "cancel_scheduled"]


@dataclass(frozen=True)
class CancelOutcome:
    """One job's answer: whether it was cancelled (it will not run), and one line saying so or
    why not. job: the scheduled job cancelled (None when not). too_late: a consumer took a
    firing first (it runs, or ran). attempted: False for a job after an error stopped the
    batch (nothing was done to it)."""

    job_id: str
    cancelled: bool
    text: str
    job: ScheduledJob | None = None
    too_late: bool = False
    attempted: bool = True


@dataclass
class CancelReport:
    """What a bulk cancel did on `channel`: one outcome per job id, in the order given."""

    channel: str
    outcomes: list[CancelOutcome] = field(default_factory=list)

    @property
    def cancelled(self) -> int:
        return sum(1 for outcome in self.outcomes if outcome.cancelled)

    @property
    def result(self) -> str:
        """'done' when every job was cancelled, 'partial' when some were, else 'failed'."""
        if self.cancelled == len(self.outcomes):
            return "done"
        return "partial" if self.cancelled else "failed"

    def summary(self) -> str:
        """One line: each job and its answer."""
        return "; ".join(f"{o.job_id}: {o.text}" for o in self.outcomes)


def cancel_scheduled(clients: ClientFactory, settings: Settings, job_ids: Iterable[str],
                     channel: str | None = None, actor: str = "",
                     store: ScheduleStore | None = None) -> CancelReport:
    """Cancel each of `job_ids` (module doc); `channel`: the jobs' channel (looked up directly
    instead of scanning the schedule group), `actor`: who cancels them (on each job's
    timeline). store: the schedule store to use (default: one on `clients`)."""
    store = store or ScheduleStore(clients, settings)
    report = CancelReport(channel or "")
    by = actor or "unknown"
    stopped = ""
    for job_id in dict.fromkeys(job_ids):
        if stopped:
            report.outcomes.append(CancelOutcome(
                job_id, False, f"not attempted: {stopped}", attempted=False))
            continue
        try:
            job = store.cancel(job_id, channel, actor=actor)
        except TooLate as error:
            report.outcomes.append(CancelOutcome(job_id, False, str(error), too_late=True))
        except ScheduleNotFound as error:
            report.outcomes.append(CancelOutcome(job_id, False, str(error)))
        except (ClientError, BotoCoreError, MessengerError) as error:
            why = f"{type(error).__name__}: {error}"
            stopped = f"an earlier cancel failed ({why})"
            report.outcomes.append(CancelOutcome(
                job_id, False, f"{why}; it may not be cancelled: cancel it again"))
        else:
            report.outcomes.append(CancelOutcome(job_id, True, f"cancelled by {by}", job=job))
    return report
