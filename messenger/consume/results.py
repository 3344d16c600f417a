"""A keep_results consumer's side of job results: each final outcome it reaches is written
(`messenger.jobs.results.ResultStore.finish`) before its message leaves the queue, then
whatever waits on the job is advanced (`messenger.jobs.workflows.Workflows.advance`).

`messenger.consume.outcome.OutcomePolicy` calls `ResultKeeper.keep` for both runtimes at every
final outcome: completed (with the handler's return value), dead-lettered for any reason,
cancelled (running, or unrun: the job-id claim found it cancelled). Not for a duplicate: the
other copy's run is the job's. A write that fails raises: the policy then leaves the message in
its queue, visible again after the backoff delay (as when the idempotency store fails: not the
handler's failure, never a dead letter), so an outcome is never lost, at the price of a second
run of a job whose write failed after its handler returned. An advance that fails is only
reported (`workflow_advance_failed`): the outcome is recorded, and the workflows' sweeper
releases what still waits on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from messenger.jobs.results import FinalOutcome, ResultStore

#: Emits a lifecycle event (the consumer's `emit`).
Emit = Callable[..., None]


class ResultKeeper:
    """Writes a consumer's final outcomes and advances their waiters (module doc).

    store: the outcomes' store. channel: the consumer's channel (its name, as outcomes and
    status records name it). retention_seconds: how long an outcome is kept (the channel's
    retention, as its status records). emit: the consumer's `emit` (events of failures).
    advance: what waiters are handed to (default: `Workflows(clients, settings).advance`,
    made at the first outcome with waiters)."""

    def __init__(self, store: ResultStore, channel: str, retention_seconds: int, emit: Emit,
                 advance: Callable[[FinalOutcome, frozenset[str]], None] | None = None) -> None:
        self.store = store
        self.channel = channel
        self.retention_seconds = retention_seconds
        self.emit = emit
        self._advance = advance
        self._lock = threading.Lock()

    def keep(self, outcome: FinalOutcome) -> None:
        """Record `outcome` (raises when the store fails), then advance its waiters (a
        failure there is reported, not raised)."""
        waiters = self.store.finish(outcome, self.retention_seconds)
        if not waiters:
            return
        try:
            self.advancer()(outcome, waiters)
        except Exception as error:
            self.emit("workflow_advance_failed", outcome.job_id, fields={
                "outcome": outcome.outcome.value, "waiters": len(waiters),
                "error": f"{type(error).__name__}: {error}"})

    def advancer(self) -> Callable[[FinalOutcome, frozenset[str]], None]:
        """`Workflows.advance` of this consumer's clients and settings (made once)."""
        with self._lock:
            if self._advance is None:
                from messenger.jobs.workflows import Workflows  # loaded when something waits

                workflows: Any = Workflows(self.store.clients, self.store.settings,
                                           results=self.store)
                self._advance = workflows.advance
            return self._advance
