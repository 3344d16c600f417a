"""What the consumer runtime's parts share: `RuntimeParts` declares the state `Runtime` keeps
(its locks, the messages it holds, the work queue, its threads' helpers) and the methods each
part calls on another, so that each part (`receiving`, `workers`, `shutdown`) type-checks on its
own. `Runtime` (`messenger.consume.runtime`) is the one class that has them all."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from messenger.consume.controls import ControlWatcher
    from messenger.consume.host import RuntimeHost
    from messenger.consume.lease import LeaseKeeper
    from messenger.consume.levels import LevelPoller
    from messenger.consume.mailbox import DeleteBatcher, Delivery, Mailbox
    from messenger.consume.outcome import OutcomePolicy
    from messenger.consume.prefetch import Prefetch
    from messenger.consume.settings import ConsumerSettings
    from messenger.consume.watchdog import Watchdog
    from messenger.consume.work_queue import WorkQueue
    from messenger.jobs.controls import PauseMark


class RuntimeParts:
    """The consumer runtime's shared state and cross-part methods (declarations only)."""

    # The state the runtime's parts share (set by `Runtime.__init__`).
    consumer: RuntimeHost
    config: ConsumerSettings
    mailbox: Mailbox
    poller: LevelPoller | None
    visibility: int
    stopping: threading.Event
    _lock: threading.RLock
    _cond: threading.Condition
    _held: dict[str, Delivery]
    _deleting: dict[str, Delivery]
    _stuck: dict[int, float]
    _last_poll_empty: bool
    _last_poll_dry: bool
    _last_poll_trickle: bool
    _progress: int
    _work: WorkQueue
    _receiver: threading.Thread | None
    _in_flight: dict[int, tuple[float, int]]
    _receive_keys: Iterator[int]
    _chain_seconds: float | None
    _recent_chains: deque[float]
    prefetch: Prefetch
    deleter: DeleteBatcher
    leases: LeaseKeeper
    watchdog: Watchdog
    paused: PauseMark | None
    controls: ControlWatcher | None
    outcomes: OutcomePolicy

    if TYPE_CHECKING:  # the other parts' methods (`Runtime` has them all)
        def free_slots(self) -> int: ...

        def refresh_state(self) -> None: ...

        def fail(self, error: BaseException) -> None: ...

        def stop(self) -> None: ...

        def _guarded(self, target: Callable[[], None]) -> Callable[[], None]: ...

        def _dispatch(self, deliveries: list[Delivery], inline: bool = True) -> None: ...

        def _release(self, deliveries: Sequence[Delivery], reason: str) -> None: ...
