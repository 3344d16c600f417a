"""Idempotent handlers: a message id's handler runs to completion at most once within a window.

A consumer with `idempotent = True` (or an `idempotency_key` function) runs its handler through
Powertools' idempotency utility on DynamoDB (`IdempotencyHandler` with a
`DynamoDBPersistenceLayer`; Powertools is imported only by such a consumer):
- before the handler, one conditional PutItem records the key IN_PROGRESS, expiring after the
  consumer's `processing_timeout` (a handler that died mid-run frees its key by then);
- a handler that returns marks it COMPLETED (UpdateItem) for `idempotency_window` seconds;
- a handler that raises deletes the record (DeleteItem): the retry runs it again;
- a key found COMPLETED raises `AlreadyDone` (the runtime deletes the message with a
  `duplicate_skipped` event); a key IN_PROGRESS elsewhere raises `InProgressElsewhere` (the
  runtime makes the message visible again after `retry_after` seconds, neither failed nor
  dead-lettered).

Table `<namespace->messenger-idempotency`: partition key `id` ('<channel>#<md5 of the key>'),
TTL on `expires_at`. The key is the message id unless `idempotency_key(message)` names another.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from messenger.aws import ClientFactory
from messenger.channel import idempotency_table_name
from messenger.errors import InvalidSettings
from messenger.jobs.tables import EXPIRES_AT, ensure_table
from messenger.settings import Settings

#: The default window: a duplicate delivered up to an hour after the first run is skipped.
DEFAULT_WINDOW_SECONDS = 3600
#: The key attribute of the table.
KEY_ATTRIBUTE = "id"


class AlreadyDone(Exception):
    """The handler already ran to completion for this key within the window."""


class InProgressElsewhere(Exception):
    """A handler for this key is running (or died less than its processing timeout ago)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"a handler for this key is still in progress; retry in {retry_after} s")
        self.retry_after = retry_after


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
        self.config = IdempotencyConfig(expires_after_seconds=window,
                                        raise_on_no_idempotency_key=True,
                                        # Powertools reads only get_remaining_time_in_millis.
                                        lambda_context=_Deadline(  # type: ignore[arg-type]
                                            processing_timeout))
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

    def run(self, handler: Callable[[Any], Any], message: Any) -> None:
        """Run `handler(message)` unless its key ran already (AlreadyDone) or runs elsewhere
        (InProgressElsewhere); what the handler raises is raised (its record deleted)."""
        from aws_lambda_powertools.utilities.idempotency.base import IdempotencyHandler
        from aws_lambda_powertools.utilities.idempotency.exceptions import (
            IdempotencyAlreadyInProgressError,
        )

        self.ensure()
        ran = []

        def call() -> None:
            ran.append(True)
            handler(message)

        key = self.key(message)
        runner = IdempotencyHandler(
            function=call, function_payload=None if key is None else str(key), config=self.config,
            persistence_store=self.store, key_prefix=self.channel, function_args=(),
            function_kwargs={},
        )
        try:
            runner.handle()
        except IdempotencyAlreadyInProgressError:
            raise InProgressElsewhere(self.retry_after) from None
        if not ran:
            raise AlreadyDone(f"already handled within the last {self.config.expires_after_seconds}"
                              f" s")
