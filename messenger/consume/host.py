"""`RuntimeHost`: what the runtime and its watchdog need of the consumer they run.

`Consumer` implements it; the runtime depends on this small interface, not on the consumer class,
so that imports run one way: consumer → runtime → watchdog → host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from messenger.consume.failures import RetryPolicy
from messenger.consume.lifecycle import ConsumerState, LifecycleHooks
from messenger.consume.mailbox import ReceivedMessage
from messenger.consume.settings import ConsumerSettings
from messenger.jobs.fired import FiringClaims
from messenger.schema import BodySchema
from messenger.settings import Settings

if TYPE_CHECKING:  # loaded only by a consumer that tracks status or is idempotent
    from messenger.consume.idempotency import IdempotencyGuard
    from messenger.consume.results import ResultKeeper
    from messenger.consume.tracking import StatusTracker


class Gate(Protocol):
    """A channel's limit gate as the outcome policy asks it (`messenger.consume.limits`)."""

    def admit(self, tenant: str | None, units: int = 1, room: float | None = None,
              ordered: bool = False, holds: int = 0,
              alive: Callable[[], bool] | None = None, job: str = "") -> int: ...

    def rate_limited(self, retry_after: float) -> None: ...


class RuntimeHost(Protocol):
    """The consumer as its runtime sees it: settings, the handler, events, hooks and state."""

    runtime: ConsumerSettings
    settings: Settings
    transition_lock: threading.RLock
    body_schema: BodySchema | None
    #: Runs the handler at most once per key (None: the consumer is not idempotent).
    idempotency: IdempotencyGuard | None
    #: Claims of jobs fired by the scheduler: a retried firing is one job (None: none made).
    firings: FiringClaims | None
    #: Status tracking (None: the channel does not track status).
    status: StatusTracker | None
    #: Final outcomes and results (None: the channel does not keep results).
    results: ResultKeeper | None

    @property
    def limits(self) -> Gate | None:
        """The channel's limits (`messenger.consume.limits.LimitGate`; None: it has none)."""

    # The consumer class's attributes (class variables): read-only here.
    @property
    def ordered(self) -> bool: ...

    @property
    def processing_timeout(self) -> float: ...

    @property
    def visibility_timeout(self) -> int: ...

    @property
    def max_receives(self) -> int: ...

    @property
    def retry_policy(self) -> RetryPolicy: ...

    @property
    def final_errors(self) -> tuple[type[BaseException], ...]: ...

    def handler(self, message: ReceivedMessage) -> Any: ...

    def weight(self, message: ReceivedMessage) -> int: ...

    def emit(self, name: str, message_id: str | None = None, duration: float | None = None,
             fields: dict[str, Any] | None = None) -> None: ...

    def run_hooks(self, hook: LifecycleHooks, *args: Any) -> None: ...

    def check_delay(self, message: ReceivedMessage) -> None: ...

    def transition(self, state: ConsumerState) -> None: ...

    def touch_health(self) -> None: ...

    def flush_health(self) -> None: ...

    def beat(self) -> None: ...
