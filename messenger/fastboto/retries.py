"""botocore's own retries held to a deadline: no retry once it has passed, no backoff past it.

botocore (standard retry mode) decides each retry in the `needs-retry` event: `Endpoint.
_needs_retry` emits it to every handler and takes the first non-None answer: None or False,
no retry (the attempt's parsed error response, or its exception, goes to the caller as
botocore raises it); a number, sleep that long and retry. The standard mode's handler is a
`RetryHandler.needs_retry` registered under the unique id `retry-config-<service>`; it checks
the attempt count and the error, takes a retry token from the client's retry quota, and
computes the exponential backoff with jitter.

`bound_retries` puts that handler behind `BoundedRetries`, under the same unique id: past the
deadline it answers False without consulting botocore's handler, so no retry is made and no
retry token is taken for one; before it, it asks botocore's handler and caps the delay it
answers at the time left. botocore's quota accounting (a token taken per retry made, given
back when a retried call succeeds) and its own no-retry answers are kept as they are.

A first-registered `needs-retry` hook alone (public events only, what `messenger.aws` falls
back to) can stop retries past the deadline, but botocore's handler still runs after it (the
endpoint emits to every handler) and takes a retry token for a retry never made, and a
backoff chosen before the deadline still sleeps in full past it. Wrapping needs the handler,
which botocore keeps only in the emitter's `_unique_id_handlers` (reached through the
client's `EventAliaser._emitter`); a client where it is not found as expected is left alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from botocore.retries.standard import RetryHandler

#: The unique id botocore registers its standard-mode handler under, per hyphenized service id.
UNIQUE_ID = "retry-config-{service}"


class BoundedRetries:
    """A `needs-retry` handler: botocore's `retry` (a bound `RetryHandler.needs_retry`) held to
    `deadline()` (monotonic seconds, or None: no deadline)."""

    def __init__(self, retry: Callable[..., Any], deadline: Callable[[], float | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.retry, self.deadline, self.clock = retry, deadline, clock

    def __call__(self, **kwargs: Any) -> Any:
        deadline = self.deadline()
        if deadline is not None and self.clock() >= deadline:
            return False  # non-None: the endpoint retries no more, and no later handler decides
        delay = self.retry(**kwargs)
        if deadline is None or delay is None or delay is False:
            return delay
        return max(0.0, min(float(delay), deadline - self.clock()))


def bound_retries(client: Any, deadline: Callable[[], float | None]) -> bool:
    """Hold a botocore client's standard-mode retries to `deadline()` (`BoundedRetries`); True
    when they now are. A client whose retry handler is not found as expected is left alone."""
    service = client.meta.service_model.service_id.hyphenize()
    unique_id = UNIQUE_ID.format(service=service)
    events = client.meta.events
    emitter = getattr(events, "_emitter", events)
    entry = getattr(emitter, "_unique_id_handlers", {}).get(unique_id)
    retry = entry.get("handler") if isinstance(entry, dict) else None
    if retry is None or not isinstance(getattr(retry, "__self__", None), RetryHandler):
        return False
    event = f"needs-retry.{service}"
    events.unregister(event, unique_id=unique_id)
    events.register(event, BoundedRetries(retry, deadline), unique_id=unique_id)
    return True
