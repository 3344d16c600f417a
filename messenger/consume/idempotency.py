"""Idempotent handlers: a message id's handler runs to completion at most once within a window.

A consumer with `idempotent = True` (or an `idempotency_key` function) runs its handler through
Powertools' idempotency utility on DynamoDB (the public methods of its
`DynamoDBPersistenceLayer`; Powertools is imported only by such a consumer), in three steps that
the outcome policy (`messenger.consume.outcome`) runs outside the handler's processing timeout:
- `begin`, before the handler: one conditional PutItem records the key IN_PROGRESS, expiring
  after the consumer's `processing_timeout` (a handler that died mid-run frees its key by then);
  a key found COMPLETED raises `AlreadyDone` (the message is deleted with a `duplicate_skipped`
  event); a key IN_PROGRESS elsewhere raises `InProgressElsewhere` (the message is visible again
  after `retry_after` seconds, neither failed nor dead-lettered);
- `complete`, after a handler that returned: marks it COMPLETED (UpdateItem) for
  `idempotency_window` seconds;
- `abandon`, after a handler that raised or timed out: deletes the record (DeleteItem), so the
  retry runs it again.
Each step retries throttling and 5xx answers within the retry budget, then raises
`StoreUnavailable`.

Table `<namespace->messenger-idempotency`: partition key `id` ('<channel>#<md5 of the key>'),
TTL on `expires_at`. The key is the message id unless `idempotency_key(message)` names another.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from messenger.aws import ClientFactory, call_with_budget
from messenger.channel import idempotency_table_name
from messenger.errors import InvalidSettings, RetryBudgetExhausted
from messenger.jobs.tables import EXPIRES_AT, ensure_table
from messenger.settings import Settings

#: The default window: a duplicate delivered up to an hour after the first run is skipped.
DEFAULT_WINDOW_SECONDS = 3600
#: The key attribute of the table.
KEY_ATTRIBUTE = "id"
#: The `status` of Powertools' idempotency records, as its persistence layers store it in the
#: table's `status` attribute (stored data: a table outlives the version that wrote it, and the
#: TypeScript runtime exports the same strings as IdempotencyRecordStatus). Powertools for
#: Python keeps them in a module with no public names (persistence.datarecord), so the guard
#: compares with its own copy (tests/integration/test_idempotent_handlers.py checks both).
RECORD_INPROGRESS = "INPROGRESS"
RECORD_COMPLETED = "COMPLETED"


class AlreadyDone(Exception):
    """The handler already ran to completion for this key within the window."""


class InProgressElsewhere(Exception):
    """A handler for this key is running (or died less than its processing timeout ago)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"a handler for this key is still in progress; retry in {retry_after} s")
        self.retry_after = retry_after


class StoreUnavailable(RetryBudgetExhausted):
    """The idempotency table did not answer (throttled, 5xx) within the retry budget."""


class _Deadline:
    """Stands in for the Lambda context Powertools reads the in-progress expiry from."""

    def __init__(self, seconds: float) -> None:
        self.millis = int(seconds * 1000)

    def get_remaining_time_in_millis(self) -> int:
        return self.millis


class IdempotencyGuard:
    """Runs handlers at most once per key (see the module doc); safe to share between threads.

    channel: the key prefix. processing_timeout: seconds a key stays IN_PROGRESS. window:
    seconds a COMPLETED key stays (1 s to 14 days). key: message → key (default message_id).
    """

    def __init__(self, clients: ClientFactory, settings: Settings, channel: str,
                 processing_timeout: float, window: Any = DEFAULT_WINDOW_SECONDS,
                 key: Callable[[Any], Any] | None = None) -> None:
        from aws_lambda_powertools.utilities.idempotency import (
            DynamoDBPersistenceLayer,
            IdempotencyConfig,
        )

        if isinstance(window, bool) or not isinstance(window, int) or \
                not 1 <= window <= 14 * 86_400:
            raise InvalidSettings(f"idempotency_window must be a whole number of seconds from 1 "
                                  f"to {14 * 86_400}, got {window!r}")
        self.clients = clients
        self.settings = settings
        self.channel = channel
        self.table = idempotency_table_name(settings.namespace)
        self.retry_after = max(1, math.ceil(processing_timeout))
        self.key = key or (lambda message: message.message_id)
        # No key (None or empty) raises: a message is never run unguarded by mistake.
        self._deadline = _Deadline(processing_timeout)
        self.config = IdempotencyConfig(expires_after_seconds=window,
                                        raise_on_no_idempotency_key=True,
                                        # Powertools reads only get_remaining_time_in_millis.
                                        lambda_context=self._deadline)  # type: ignore[arg-type]
        self.store = DynamoDBPersistenceLayer(
            table_name=self.table, key_attr=KEY_ATTRIBUTE, expiry_attr=EXPIRES_AT,
            boto3_client=clients.client("dynamodb"),
        )
        self._ready = False
        self._lock = threading.Lock()

    def ensure(self) -> None:
        """Create (auto) or check (verify) the table, once."""
        with self._lock:
            if not self._ready:
                ensure_table(self.clients, self.settings, self.table, "idempotency",
                             KEY_ATTRIBUTE)
                self._ready = True

    def _configured(self) -> Any:
        if not self.store.configured:
            self.store.configure(self.config, key_prefix=self.channel)
        return self.store

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        return call_with_budget(call, self.settings.retry_budget_seconds,
                                f"{what} in {self.table}", error=StoreUnavailable)

    def begin(self, message: Any) -> str:
        """Record the message's key IN_PROGRESS; returns the key for `complete` / `abandon`.
        Raises AlreadyDone, InProgressElsewhere, or StoreUnavailable (nothing recorded)."""
        from aws_lambda_powertools.utilities.idempotency.exceptions import (
            IdempotencyItemAlreadyExistsError,
            IdempotencyItemNotFoundError,
        )

        self.ensure()
        store = self._configured()
        value = self.key(message)
        key = "" if value is None else str(value)  # no key raises: never run unguarded
        for _ in range(3):  # a record that expires between the put and the read: put again
            try:
                self._call("PutItem", lambda: store.save_inprogress(
                    data=key, remaining_time_in_millis=self._deadline.millis))
                return key
            except IdempotencyItemAlreadyExistsError as exists:
                record = exists.old_data_record
                if record is None:
                    try:
                        record = self._call("GetItem", lambda: store.get_record(data=key))
                    except IdempotencyItemNotFoundError:
                        continue
            if record is None:
                continue
            if record.status == RECORD_COMPLETED:
                raise AlreadyDone(f"already handled within the last "
                                  f"{self.config.expires_after_seconds} s")
            if record.status == RECORD_INPROGRESS:
                raise InProgressElsewhere(self.retry_after)
        raise InProgressElsewhere(self.retry_after)

    def complete(self, key: str) -> None:
        """The handler of `key` returned: COMPLETED for the window (StoreUnavailable)."""
        store = self._configured()
        self._call("UpdateItem", lambda: store.save_success(data=key, result={}))

    def abandon(self, key: str, error: BaseException | None = None) -> None:
        """The handler of `key` raised or timed out: delete its record, so that the retry runs
        it (StoreUnavailable)."""
        store = self._configured()
        self._call("DeleteItem", lambda: store.delete_record(
            data=key, exception=error if isinstance(error, Exception) else RuntimeError()))

    def run(self, handler: Callable[[Any], Any], message: Any) -> None:
        """Run `handler(message)` unless its key ran already (AlreadyDone) or runs elsewhere
        (InProgressElsewhere); what the handler raises is raised (its record deleted)."""
        key = self.begin(message)
        try:
            handler(message)
        except BaseException as error:
            self.abandon(key, error)
            raise
        self.complete(key)
