"""`ConsumerSettings`: how a consumer process runs (concurrency, timeouts, health file), read from
the environment; the consumer class's attributes give the defaults."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from messenger.consume.health import (
    DEFAULT_REFRESH_SECONDS,
    MAX_REFRESH_SECONDS,
    MIN_REFRESH_SECONDS,
)
from messenger.errors import InvalidSettings

LONG_POLL_SECONDS = 20
RETRY_DELAY_SECONDS = 5
#: Longest a consumer may hold log lines before writing them (what a kill -9 can lose).
MAX_LOG_HOLD_SECONDS = 5.0
#: Longest a received message may wait in memory for a worker (`prefetch_wait`), and its default.
MAX_PREFETCH_WAIT_SECONDS = 5.0
DEFAULT_PREFETCH_WAIT_SECONDS = 0.5
#: Where a tracked channel's status records are written from (`status_writer`).
STATUS_WRITERS = ("process", "thread")


def _check_seconds(name: str, variable: str | None, value: object, low: float | None) -> None:
    """A duration must be a finite number: NaN compares false with every limit, so a NaN grace
    or timeout would make a stuck consumer read as healthy forever. low None: > 0, else >= low."""
    label = f"{name} ({variable})" if variable else name
    allowed = "> 0" if low is None else f">= {low:g}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or (value <= 0 if low is None else value < low):
        raise InvalidSettings(
            f"{label} must be a finite number of seconds {allowed}, got {value!r}"
        )


@dataclass(frozen=True)
class ConsumerSettings:
    """How a consumer process runs (environment variables in brackets).

    concurrency: worker threads, >= 1 (MESSENGER_CONCURRENCY; default the class's, else 1).
    shutdown_timeout: seconds in-flight work may take after SIGTERM, > 0; keep it below the ECS
    stopTimeout (MESSENGER_SHUTDOWN_TIMEOUT; default 30).
    health_file: path; its directory must exist (MESSENGER_HEALTH_FILE; default None: one per
    consumer class in the temporary directory, `messenger.consume.health.default_health_file`).
    health_refresh: seconds between rewrites of the health file, 0.1-60; the check fails when it
    is 3 intervals old (MESSENGER_HEALTH_REFRESH_SECONDS; 5).
    startup_timeout: seconds INITIALIZING/INITIALIZED may last (MESSENGER_STARTUP_TIMEOUT; 120).
    health_grace: seconds added to processing/shutdown timeouts in the health file
    (MESSENGER_HEALTH_GRACE; 30). stuck_grace: seconds a timed-out handler thread may keep
    running before the consumer exits non-zero (default: shutdown_timeout).
    log_hold: seconds INFO lifecycle lines may be held in memory and written together, 0 to
    MAX_LOG_HOLD_SECONDS; 0 writes each line at once (MESSENGER_LOG_HOLD_SECONDS; 0.25).
    prefetch_wait: seconds a received message may wait in memory for a worker, 0 to
    MAX_PREFETCH_WAIT_SECONDS: the receiver fetches ahead for workers expected to free up within
    one receive round trip, and a message still waiting this long is released, visible again at
    once (`messenger.consume.prefetch`); 0 fetches only for free workers
    (MESSENGER_PREFETCH_WAIT_SECONDS; 0.5).
    status_writer: where a tracked channel's status records are written from: 'thread', a thread
    of the consumer, or 'process', a child process fed through a pipe
    (`messenger.jobs.status_writer`: the writer's CPU leaves the consumer's GIL, for a task with
    a core to spare; about 48 MB more memory, 36 MB of it its own, and a little more CPU in all)
    (MESSENGER_STATUS_WRITER; 'thread'). The Lambda runtime always uses a thread.
    """

    concurrency: int = 1
    shutdown_timeout: float = 30.0
    health_file: str | None = None
    health_refresh: float = DEFAULT_REFRESH_SECONDS
    startup_timeout: float = 120.0
    health_grace: float = 30.0
    stuck_grace: float | None = None
    wait_time_seconds: int = LONG_POLL_SECONDS
    #: Seconds before a failed message's second attempt (None: the consumer class's
    #: `retry_delay`); later attempts wait longer by the class's `retry_backoff`.
    retry_delay: float | None = None
    delete_linger: float = 0.2
    log_hold: float = 0.25
    prefetch_wait: float = DEFAULT_PREFETCH_WAIT_SECONDS
    status_writer: str = "thread"

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) \
                or self.concurrency < 1:
            raise InvalidSettings(
                f"concurrency (MESSENGER_CONCURRENCY) must be a whole number >= 1, "
                f"got {self.concurrency!r}"
            )
        for name, variable, low in (
            ("shutdown_timeout", "MESSENGER_SHUTDOWN_TIMEOUT", None),
            ("startup_timeout", "MESSENGER_STARTUP_TIMEOUT", None),
            ("health_grace", "MESSENGER_HEALTH_GRACE", 0.0),
            ("delete_linger", None, 0.0),
        ):
            _check_seconds(name, variable, getattr(self, name), low)
        for name, variable, low, high in (
            ("log_hold", "MESSENGER_LOG_HOLD_SECONDS", 0.0, MAX_LOG_HOLD_SECONDS),
            ("prefetch_wait", "MESSENGER_PREFETCH_WAIT_SECONDS", 0.0, MAX_PREFETCH_WAIT_SECONDS),
            ("health_refresh", "MESSENGER_HEALTH_REFRESH_SECONDS", MIN_REFRESH_SECONDS,
             MAX_REFRESH_SECONDS),
        ):
            value = getattr(self, name)
            _check_seconds(name, variable, value, low)
            if value > high:
                raise InvalidSettings(f"{name} ({variable}) must be from {low:g} to {high:g} "
                                      f"seconds, got {value!r}")
        for name in ("stuck_grace", "retry_delay"):
            if getattr(self, name) is not None:
                _check_seconds(name, None, getattr(self, name), 0.0)
        if self.status_writer not in STATUS_WRITERS:
            raise InvalidSettings(f"status_writer (MESSENGER_STATUS_WRITER) must be one of "
                                  f"{', '.join(STATUS_WRITERS)}, got {self.status_writer!r}")
        if not 0 <= self.wait_time_seconds <= LONG_POLL_SECONDS:
            raise InvalidSettings(f"wait_time_seconds must be from 0 to {LONG_POLL_SECONDS}")

    @property
    def stuck_after(self) -> float:
        """Seconds a timed-out handler thread may keep running before the consumer exits."""
        return self.shutdown_timeout if self.stuck_grace is None else self.stuck_grace

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **defaults: Any
    ) -> ConsumerSettings:
        """Settings from the environment; `defaults` apply where a variable is not set."""
        env = os.environ if environ is None else environ
        values = dict(defaults)
        for name, variable, kind in (
            ("concurrency", "MESSENGER_CONCURRENCY", int),
            ("shutdown_timeout", "MESSENGER_SHUTDOWN_TIMEOUT", float),
            ("health_file", "MESSENGER_HEALTH_FILE", str),
            ("startup_timeout", "MESSENGER_STARTUP_TIMEOUT", float),
            ("health_grace", "MESSENGER_HEALTH_GRACE", float),
            ("health_refresh", "MESSENGER_HEALTH_REFRESH_SECONDS", float),
            ("log_hold", "MESSENGER_LOG_HOLD_SECONDS", float),
            ("prefetch_wait", "MESSENGER_PREFETCH_WAIT_SECONDS", float),
            ("status_writer", "MESSENGER_STATUS_WRITER", str),
        ):
            raw = env.get(variable)
            if raw:
                try:
                    values[name] = kind(raw)
                except ValueError:
                    raise InvalidSettings(f"{variable} must be a number, got {raw!r}") from None
        return cls(**{k: v for k, v in values.items() if v is not None})
