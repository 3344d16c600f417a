"""`ChannelSending`: how a producer reaches its channel and sends batches to it.

Finds (or provisions) the queue or topic of each priority level once, runs a send within the
retry budget and provisions a channel again once when it vanished (`auto` provisioning); cuts
prepared items into batches of up to 10 entries within the channel's size, retries the entries
SQS or SNS failed transiently, and records QUEUED for what was accepted. A mixin of
`messenger.produce.base.BaseProducer`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from messenger.aws import call_with_budget, error_code
from messenger.channel import MAX_BATCH_ENTRIES
from messenger.errors import ChannelNotFound
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.produce.push import PreparedItem, PushFailure, PushManyResult
from messenger.produce.transport import EntryFailure, QueueTarget, TopicTarget
from messenger.provision import is_missing_resource
from messenger.settings import Settings
from messenger.tracing import ProducerTrace

logger = logging.getLogger("messenger.producer")


def failure_code(error: BaseException) -> str:
    """The code a push_many failure reports: AWS's error code, else the exception's type."""
    return error_code(error) or type(error).__name__


class ChannelSending:
    """Sends prepared items to the channel's targets (see the module doc)."""

    # What it reads of the producer (`BaseProducer` defines them).
    channel: ClassVar[str]
    channel_limit: ClassVar[int]
    settings: Settings
    status: StatusStore | None
    _lock: threading.Lock
    _targets: dict[str | None, QueueTarget | TopicTarget]

    def _make_target(self, level: str | None) -> QueueTarget | TopicTarget:
        raise NotImplementedError

    def _get_target(self, level: str | None, refresh: bool = False) -> QueueTarget | TopicTarget:
        with self._lock:
            target = self._targets.get(level)
            if target is None or refresh:
                target = self._targets[level] = self._make_target(level)
            return target

    def _with_target(self, level: str | None, action: Callable[[Any], Any], what: str) -> Any:
        """Run `action(target)` within the retry budget; reprovision once if the target vanished."""
        budget = self.settings.retry_budget_seconds
        target = call_with_budget(
            lambda: self._get_target(level), budget, f"locating channel {self.channel!r}"
        )
        try:
            return call_with_budget(lambda: action(target), budget, f"{what} to {self.channel!r}")
        except Exception as error:
            if not is_missing_resource(error):
                raise
            if self.settings.provisioning != "auto":
                raise ChannelNotFound(
                    f"channel {self.channel!r} disappeared ({error_code(error)}) and "
                    f"provisioning=verify: redeploy it"
                ) from error
            logger.warning("channel %s is missing; reprovisioning it", self.channel)
            target = call_with_budget(
                lambda: self._get_target(level, refresh=True),
                budget,
                f"reprovisioning {self.channel!r}",
            )
            return call_with_budget(lambda: action(target), budget, f"{what} to {self.channel!r}")

    def _record_queued(self, message_ids: list[str], sent_at: float,
                       event: StatusEvent = StatusEvent.QUEUED) -> None:
        """Record QUEUED (or `event`) for messages SQS accepted, stamped `sent_at`: when their
        request went out (they may be received before its answer is back, never before it went
        out)."""
        if self.status is None:
            return
        for message_id in message_ids:
            self.status.record(StatusRecord(message_id, event, self.channel, at=sent_at))

    def _batches(self, prepared: list[PreparedItem]) -> Iterable[list[PreparedItem]]:
        batch: list[PreparedItem] = []
        size = 0
        for entry in prepared:
            entry_size = entry.outgoing.encoded.size
            if batch and (
                len(batch) == MAX_BATCH_ENTRIES or size + entry_size > self.channel_limit
            ):
                yield batch
                batch, size = [], 0
            batch.append(entry)
            size += entry_size
        if batch:
            yield batch

    def _send_batch(self, level: str | None, batch: list[PreparedItem], result: PushManyResult,
                    trace: ProducerTrace | None = None) -> None:
        if trace is None:
            return self._send_entries(level, batch, result)
        with trace.sending(len(batch)):
            failed = len(result.failures)
            self._send_entries(level, batch, result)
            trace.batch_sent([entry.index for entry in batch], len(result.failures) - failed)

    def _send_entries(
        self, level: str | None, batch: list[PreparedItem], result: PushManyResult
    ) -> None:
        pending = batch

        def send(target: QueueTarget | TopicTarget) -> list[EntryFailure]:
            return target.send_batch([entry.outgoing for entry in pending])

        deadline = time.monotonic() + self.settings.retry_budget_seconds
        attempt = 0
        while pending:
            sent_at = time.time()
            try:
                failures = self._with_target(level, send, "push_many")
            except Exception as error:  # reported per item, never raised
                # e.g. access denied: report this batch; batches already sent keep their ids.
                for entry in pending:
                    result.failures.append(
                        PushFailure(entry.index, failure_code(error), str(error))
                    )
                return
            failed = {failure.index: failure for failure in failures}
            retry = []
            accepted = []
            for position, entry in enumerate(pending):
                failure = failed.get(position)
                if failure is None:
                    result.message_ids[entry.index] = entry.message_id
                    accepted.append(entry.message_id)
                elif failure.sender_fault or time.monotonic() >= deadline:
                    result.failures.append(
                        PushFailure(entry.index, failure.code, failure.message)
                    )
                else:
                    retry.append(entry)
            self._record_queued(accepted, sent_at)
            pending = retry
            if pending:
                attempt += 1
                time.sleep(min(2.0, 0.05 * 2**attempt))
