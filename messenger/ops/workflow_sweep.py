"""The workflows' sweep in the 15-minute operations run (issue 52).

`messenger.jobs.workflows.Workflows.sweep` finishes what crashes left: outcomes no consumer
applied, releases left half-done, groups whose producer stopped before sending every member,
held jobs whose dependencies never finished within their channel's retention (settled
EXPIRED). The queue alarm's `{"scope": "source"}` run calls it every 15 minutes; a sweep that
fails never stops the alarm (its error is reported, and the invocation fails after the report).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from messenger.aws import ClientFactory
from messenger.errors import ChannelNotFound
from messenger.jobs.workflows import Workflows
from messenger.settings import Settings

logger = logging.getLogger("messenger.ops.workflows")


@dataclass(frozen=True)
class WorkflowSweep:
    """What one sweep did (`jobs.workflows.SweepReport`'s counts: looked, applied, released,
    cancelled, expired, never_sent), or why it failed (`error`, '' when it did not)."""

    counts: dict[str, int] = field(default_factory=dict)
    error: str = ""


def sweep_workflows(clients: ClientFactory, settings: Settings,
                    now: float | None = None) -> WorkflowSweep:
    """One sweep of the namespace's workflows (at `now`, default the clock's). A namespace
    without the workflows table (verify mode, nothing ever waited) has nothing to sweep."""
    try:
        report = Workflows(clients, settings).sweep(now)
    except ChannelNotFound:
        return WorkflowSweep()
    except Exception as error:  # the alarm's own work goes on; the error is reported
        logger.exception("workflow sweep failed")
        return WorkflowSweep(error=f"{type(error).__name__}: {error}"[:500])
    return WorkflowSweep(asdict(report))
