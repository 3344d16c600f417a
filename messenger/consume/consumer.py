"""`Consumer`: the base class of a service that handles the messages of one channel.

    class ProcessMobileEventsConsumer(Consumer):
        channel = 'wishlist_events_exchange.process_mobile_events'
        ordered = True
        message_filter = MessageFilter(filter_type='prefix', values=['MOBILE.'])
        processing_timeout = 60

        def handler(self, message): ...

        @register_hook(LifecycleHooks.MSG_PROCESSING_START)
        def activate_locale(self, message): ...

    ProcessMobileEventsConsumer().run()     # or: messenger consume package.module:Class

The runtime (threads, heartbeat, timeouts, deletes) is in `messenger.consume.runtime`; the SQS
calls in `messenger.consume.mailbox`; states, hooks and the JSON log in
`messenger.consume.lifecycle`.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from messenger.aws import ClientFactory, call_with_budget
from messenger.channel import (
    DEFAULT_MAX_RECEIVES,
    DEFAULT_RETENTION_SECONDS,
    SQS_MAX_VISIBILITY_TIMEOUT,
    ChannelSpec,
    ChannelTags,
    MessageFilter,
    declared_keep_results,
    declared_track_status,
)
from messenger.consume.controls import READ_TIMEOUT_SECONDS as CONTROL_READ_TIMEOUT
from messenger.consume.failures import MAX_RETRY_DELAY_SECONDS, RetryPolicy
from messenger.consume.health import HealthFile, HealthRecord, default_health_file, health_clock
from messenger.consume.lease import renewal_read_timeout
from messenger.consume.levels import LevelPoller
from messenger.consume.lifecycle import (
    ConsumerState,
    LifecycleEvent,
    LifecycleHooks,
    collect_hooks,
    configure_json_logging,
    hold_lines,
    hook_arity,
    log_event,
)
from messenger.consume.mailbox import Mailbox, ReceivedMessage, Stage
from messenger.consume.protection import TaskProtection
from messenger.consume.runtime import ProcessingTimeout, Runtime
from messenger.consume.settings import RETRY_DELAY_SECONDS, ConsumerSettings
from messenger.errors import InvalidChannelSpec, InvalidSettings
from messenger.jobs.controls import CancelRequests
from messenger.jobs.fired import FiringClaims
from messenger.jobs.priority import PriorityPolicy
from messenger.jobs.workers import WorkerRegistry
from messenger.offload import PayloadStore
from messenger.provision import ChannelResources, Provisioner
from messenger.schema import BodySchema
from messenger.settings import Settings

if TYPE_CHECKING:  # loaded only by a consumer that tracks status (keeps results)
    from messenger.consume.limits import LimitGate
    from messenger.consume.results import ResultKeeper
    from messenger.consume.tracking import StatusTracker

logger = logging.getLogger("messenger.consumer")

#: States between which the health file may lag (at most HEALTH_LAG_SECONDS).
RUNNING_STATES = frozenset({ConsumerState.LISTENING, ConsumerState.IDLE, ConsumerState.PROCESSING,
                            ConsumerState.PAUSED})
HEALTH_LAG_SECONDS = 1.0
#: How often the main thread looks for a shutdown request while the channel is resolved.
STARTUP_POLL_SECONDS = 0.05
#: The final write of status records gets what the shutdown timeout leaves after SIGTERM, and at
#: least this (a few BatchWriteItem calls: the writer flushes every half second while running).
FINAL_STATUS_FLUSH_SECONDS = 2.0

_heap_frozen = False
_heap_lock = threading.Lock()


def freeze_startup_heap() -> None:
    """Once per process, when the first consumer has started up: collect, then freeze what is
    left (`gc.freeze`), so that the garbage collector's full collections no longer go over the
    objects of startup (modules, botocore's service models, the clients): ~235,000 objects
    that a full collection took ~115-130 ms of CPU to walk, holding the GIL (every thread of
    the consumer stopped, the lease keeper too) the first time one ran, in the middle of the
    work. Frozen objects are still freed when nothing refers to them; only a reference cycle
    among them would stay. Later consumers of the same process (tests) do not freeze again."""
    global _heap_frozen
    with _heap_lock:
        if not _heap_frozen:
            gc.collect()
            gc.freeze()
            _heap_frozen = True


MIN_PROCESSING_TIMEOUT = 1
MAX_PROCESSING_TIMEOUT = 1800
#: SQS keeps a message in flight at most 12 hours after it was received, renewals included.
SQS_MAX_IN_FLIGHT_SECONDS = 43_200
#: Seconds the last renewal of a long-running job keeps clear of that limit.
LONG_RUNNING_MARGIN = 60
#: A consumer's queue lease: short, so a dead consumer's message comes back quickly; the
#: heartbeat extends it while the handler runs.
DEFAULT_CONSUMER_VISIBILITY = 30
MIN_CONSUMER_VISIBILITY = 2
#: The largest `retry_backoff` (beyond, the second delay is the cap already).
MAX_RETRY_BACKOFF = 100

__all__ = [
    "Consumer", "ConsumerSettings", "ConsumerState", "LifecycleHooks", "ProcessingTimeout",
    "ReceivedMessage", "load_consumer",
]


class Consumer:
    """Handles the messages of one channel; subclass it and define `channel` and `handler`.

    channel: 'queue' or 'exchange.queue'. ordered: FIFO channel (default False).
    delay: 0-900 s. message_filter: routing-key filter (exchanges). processing_timeout: seconds a
    handler may run, 1-1800 (default 60); with `long_running = True`, up to SQS's 12-hour
    in-flight limit less `visibility_timeout` and a minute (43,110 s with the default
    lease). delay_tolerance: seconds of lag (now - produced_at)
    above which a 'delayed' event is logged (None: never). visibility_timeout: the queue lease,
    2-43200 s (default 30), extended by the heartbeat. max_receives: the queue's redrive
    count, 1-1000 (default 3): the safety net that moves a message to the DLQ when no consumer
    gave a verdict (one died); a failing job is dead-lettered by the consumer itself after
    `max_attempts` (see below). concurrency / shutdown_timeout: defaults
    for ConsumerSettings (the environment wins).
    priorities: the channel's levels, highest first (default none); default_priority: see
    ChannelSpec. priority_weights: a whole number >= 1 per level (default halving: 4, 2, 1);
    priority_mode: 'weighted' (default) or 'strict' (see `messenger.jobs.priority`).
    track_status: record the messages' lifecycle in the status table (default False). It is
    the channel's declaration (`ChannelSpec.track_status`), read by its producers, the HTTP API
    and the dashboard from the tag the channel's queues carry: in auto mode the consumer's
    provisioning writes it there; in verify mode a class that disagrees with the deployed
    channel does not start (InvalidChannelSpec naming both).
    keep_results: keep each job's final outcome and its handler's return value (JSON) with its
    status records, under the same expiry (needs track_status; default False): written before
    the message is deleted, read by `Producer.result(job_id)` and what waits on the job
    (`messenger.jobs.results`). The channel's declaration, checked as track_status is.
    max_attempts: runs a message gets before the consumer dead-letters it with its error, 1 to
    max_receives (default None: max_receives); a producer's `push(..., max_attempts=N)` wins.
    final_errors: exception classes whose failure is final (default none): a handler raising
    one, or `messenger.Unrecoverable`, has its message dead-lettered at once, whatever attempts
    are left, with the reason 'unrecoverable: <type>: <message>'.
    rate_limit / tenant_rate_limit / max_concurrency: the channel's limits (ChannelSpec's;
    default none; a deployed queue's declaration wins), changed at run time by `messenger
    limits set`; `weight(message)` is the units a job takes of them (docs/flow-control.md).
    retry_delay: seconds before the second attempt, 0-43200 (default 5; ConsumerSettings'
    retry_delay wins); retry_backoff: factor per later attempt, 1-100 (default 2; 1: the same
    delay each time); max_retry_delay: the longest delay, retry_delay-43200 (default 600). Each
    delay is drawn between half and all of its value (jitter).
    """

    channel: ClassVar[str] = ""
    ordered: ClassVar[bool] = False
    delay: ClassVar[int] = 0
    message_filter: ClassVar[MessageFilter | None] = None
    processing_timeout: ClassVar[float] = 60
    long_running: ClassVar[bool] = False
    delay_tolerance: ClassVar[float | None] = None
    visibility_timeout: ClassVar[int] = DEFAULT_CONSUMER_VISIBILITY
    max_receives: ClassVar[int] = DEFAULT_MAX_RECEIVES
    retention_seconds: ClassVar[int] = DEFAULT_RETENTION_SECONDS
    tags: ClassVar[ChannelTags] = ChannelTags()
    concurrency: ClassVar[int | None] = None
    shutdown_timeout: ClassVar[float | None] = None
    priorities: ClassVar[tuple[str, ...]] = ()
    default_priority: ClassVar[str | None] = None
    priority_weights: ClassVar[Mapping[str, int] | None] = None
    priority_mode: ClassVar[str] = "weighted"
    track_status: ClassVar[bool] = False
    keep_results: ClassVar[bool] = False
    rate_limit: ClassVar[str | None] = None
    tenant_rate_limit: ClassVar[str | None] = None
    max_concurrency: ClassVar[int | None] = None
    max_attempts: ClassVar[int | None] = None
    final_errors: ClassVar[tuple[type[BaseException], ...]] = ()
    retry_delay: ClassVar[float] = RETRY_DELAY_SECONDS
    retry_backoff: ClassVar[float] = 2.0
    max_retry_delay: ClassVar[float] = 600
    #: pydantic model(s) of the body (see `messenger.schema`): the handler gets the instance.
    model: ClassVar[Any] = None
    #: Run each message's handler to completion at most once within `idempotency_window`
    #: seconds (`messenger.consume.idempotency`); `idempotency_key` (message → key, default
    #: the message id) implies it.
    idempotent: ClassVar[bool] = False
    idempotency_key: ClassVar[Callable[[Any], Any] | None] = None
    idempotency_window: ClassVar[int] = 3600
    #: The runtime engine; a subclass of `Runtime` may poll other sources (override `poll`).
    runtime_class: ClassVar[type[Runtime]] = Runtime

    def __init__(
        self,
        settings: Settings | None = None,
        clients: ClientFactory | None = None,
        runtime: ConsumerSettings | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.check_runtime_defaults()
        self.runtime = runtime or ConsumerSettings.from_env(
            concurrency=self.concurrency, shutdown_timeout=self.shutdown_timeout
        )
        self._validate()
        self.spec = self.channel_spec(self.settings.namespace)
        self.body_schema = BodySchema.of(type(self).__name__, self.model)
        self.policy = self._priority_policy()
        self.clients = clients or ClientFactory(self.settings.region)
        #: Status tracking (track_status); tests may swap `status.store`.
        self.status: StatusTracker | None = None
        if self.spec.track_status:
            from messenger.consume.tracking import StatusTracker
            from messenger.jobs.status import StatusStore

            self.status = StatusTracker(StatusStore(
                self.clients, self.settings, retention_seconds=self.spec.retention_seconds))
        #: Final outcomes and results (keep_results), written before each message's delete.
        self.results: ResultKeeper | None = None
        if self.spec.keep_results:
            from messenger.consume.results import ResultKeeper
            from messenger.jobs.results import ResultStore

            self.results = ResultKeeper(ResultStore(self.clients, self.settings),
                                        self.spec.name, self.spec.retention_seconds, self.emit)
        #: The channel's limits (`start_limits`; None: it has none).
        self.limits: LimitGate | None = None
        #: This process's entry in the worker registry (`messenger workers`).
        self.workers = WorkerRegistry(self.clients, self.settings, self.spec.name,
                                      f"{type(self).__module__}.{type(self).__qualname__}")
        self.hooks = collect_hooks(type(self))
        self.idempotency = self._idempotency_guard()
        #: A job fired by the scheduler runs once per firing, retried or not (jobs.fired).
        self.firings: FiringClaims | None = FiringClaims(self.clients, self.settings,
                                                         self.spec.name)
        self.health = HealthFile(self.runtime.health_file or default_health_file(
            f"{type(self).__module__}.{type(self).__qualname__}"))
        try:
            self.health.check_directory()
        except FileNotFoundError:
            raise InvalidSettings(
                f"health_file (MESSENGER_HEALTH_FILE) {self.health.path}: directory "
                f"{self.health.directory} does not exist; create it or name another file"
            ) from None
        self._health_error: str | None = None  # the last write's error, logged once
        self._health_stop = threading.Event()
        #: ECS task scale-in protection while PROCESSING (a no-op outside ECS).
        self.protection = TaskProtection.from_env(os.environ, float(self.processing_timeout))
        self.state: ConsumerState | None = None
        self._state_since = 0.0
        self._health_dirty = False
        self._health_written_at = 0.0
        self.transition_lock = threading.RLock()
        self._runtime: Runtime | None = None
        self._stop_requested = threading.Event()
        self._stop_requested_at: float | None = None  # time.monotonic() of the first request
        self.resources: ChannelResources | None = None

    def _idempotency_guard(self) -> Any:
        key = type(self).__dict__.get("idempotency_key", self.idempotency_key)
        if isinstance(key, staticmethod):
            key = key.__func__
        if not isinstance(self.idempotent, bool) or (key is not None and not callable(key)):
            raise InvalidSettings(f"{type(self).__name__}.idempotent must be True or False and "
                                  f"idempotency_key a function of the message, got "
                                  f"{self.idempotent!r} and {key!r}")
        if not self.idempotent and key is None:
            return None
        from messenger.consume.idempotency import IdempotencyGuard  # loads Powertools

        return IdempotencyGuard(self.clients, self.settings, self.spec.name,
                                float(self.processing_timeout), self.idempotency_window, key)

    # -- to override --------------------------------------------------------------------------
    def handler(self, message: ReceivedMessage) -> Any:
        """Handle one message; return to have it deleted, raise to have it retried. On a
        channel that keeps results, what it returns (JSON) is the job's result."""
        raise NotImplementedError(f"{type(self).__name__} must define handler(self, message)")

    def weight(self, message: ReceivedMessage) -> int:
        """The units of the channel's rate limits this job takes (default 1; a whole number
        >= 1: a bulk job that calls the upstream 10 times may take 10)."""
        return 1

    def on_event(self, event: LifecycleEvent) -> None:
        """Every lifecycle event goes through here; the default writes it to the JSON log.
        Override (and call super) to also send them elsewhere, e.g. a status store."""
        log_event(event)

    # -- definition -----------------------------------------------------------------------------
    @classmethod
    def channel_spec(cls, namespace: str = "") -> ChannelSpec:
        """The consumer's channel, built from the class attributes."""
        return ChannelSpec(
            name=cls.channel, ordered=cls.ordered, delay=cls.delay,
            message_filter=cls.message_filter, max_receives=cls.max_receives,
            retention_seconds=cls.retention_seconds, visibility_timeout=cls.visibility_timeout,
            tags=cls.tags, namespace=namespace, priorities=tuple(cls.priorities),
            default_priority=cls.default_priority, track_status=cls.track_status,
            keep_results=cls.keep_results, max_concurrency=cls.max_concurrency,
            rate_limit=cls.rate_limit, tenant_rate_limit=cls.tenant_rate_limit,
        )

    def check_tracking(self, resources: ChannelResources) -> None:
        """InvalidChannelSpec when the deployed channel declares another `track_status` than
        this class (the tag its queues carry, written from the ChannelSpec it was deployed
        from): the channel's producers, API and dashboard read that declaration, so a consumer
        that disagreed would leave them answering a state it never records (or record what
        they do not expect). A queue without the tag (deployed before it existed) or whose
        tags may not be read is not checked."""
        from messenger.jobs.status import queue_tracking

        sqs = self.clients.client("sqs")
        for level in resources.levels or (resources,):
            for what, read in (("track_status", declared_track_status),
                               ("keep_results", declared_keep_results)):
                declared = queue_tracking(sqs, level.queue.url, read)
                ours = getattr(self.spec, what)
                if declared is not None and declared != ours:
                    raise InvalidChannelSpec(
                        f"{type(self).__name__}.{what} is {ours} but channel "
                        f"{self.spec.name!r} is deployed with {what}={declared} (queue "
                        f"{level.queue.name!r}); a channel's {what} is declared once, by its "
                        f"ChannelSpec: make the class agree with it, or redeploy the channel")

    def _priority_policy(self) -> PriorityPolicy | None:
        name = type(self).__name__
        if not self.spec.priorities:
            if self.priority_weights is not None or self.priority_mode != "weighted":
                raise InvalidChannelSpec(f"{name}.priority_weights and priority_mode need "
                                         f"priorities")
            return None
        return PriorityPolicy(self.spec.priorities, self.priority_weights, self.priority_mode,
                              owner=name)

    @classmethod
    def max_long_processing_timeout(cls) -> int:
        """The longest `processing_timeout` of a long-running consumer: its last renewal must
        end within SQS's 12 hours in flight."""
        return SQS_MAX_IN_FLIGHT_SECONDS - int(cls.visibility_timeout) - LONG_RUNNING_MARGIN

    @classmethod
    def check_runtime_defaults(cls) -> None:
        """The class's `concurrency` and `shutdown_timeout` (the defaults of ConsumerSettings),
        checked as class attributes, so that an error names the class, not the environment."""
        name = cls.__name__
        concurrency = cls.concurrency
        if concurrency is not None and (isinstance(concurrency, bool)
                                        or not isinstance(concurrency, int) or concurrency < 1):
            raise InvalidSettings(f"{name}.concurrency must be a whole number >= 1, or None "
                                  f"(MESSENGER_CONCURRENCY, else 1), got {concurrency!r}")
        timeout = cls.shutdown_timeout
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float)
                                    or not 0 < timeout < float("inf")):
            raise InvalidSettings(f"{name}.shutdown_timeout must be a number of seconds > 0, or "
                                  f"None (MESSENGER_SHUTDOWN_TIMEOUT, else 30), got {timeout!r}")

    def _validate(self) -> None:
        name = type(self).__name__
        if not self.channel or not isinstance(self.channel, str):
            raise InvalidChannelSpec(f"{name}.channel must name a channel ('queue' or "
                                     f"'exchange.queue')")
        if type(self).handler is Consumer.handler:
            raise InvalidChannelSpec(f"{name} must define handler(self, message)")
        _check_number(f"{name}.visibility_timeout", self.visibility_timeout,
                      MIN_CONSUMER_VISIBILITY, SQS_MAX_VISIBILITY_TIMEOUT, whole=True)
        if not isinstance(self.long_running, bool):
            raise InvalidChannelSpec(f"{name}.long_running must be True or False, got "
                                     f"{self.long_running!r}")
        if self.long_running:
            _check_number(f"{name}.processing_timeout", self.processing_timeout,
                          MIN_PROCESSING_TIMEOUT, self.max_long_processing_timeout(),
                          note=f" (long_running: SQS's 12-hour in-flight limit less "
                               f"visibility_timeout {self.visibility_timeout} s and "
                               f"{LONG_RUNNING_MARGIN} s)")
        else:
            _check_number(f"{name}.processing_timeout", self.processing_timeout,
                          MIN_PROCESSING_TIMEOUT, MAX_PROCESSING_TIMEOUT,
                          note="; set long_running = True for jobs of up to ~12 hours")
        if self.delay_tolerance is not None:
            _check_number(f"{name}.delay_tolerance", self.delay_tolerance, 0, 14 * 86_400)
        if self.max_attempts is not None:
            _check_count(f"{name}.max_attempts", self.max_attempts, self.max_receives,
                         f"{name}.max_receives")
        _check_final_errors(f"{name}.final_errors", self.final_errors)
        _check_number(f"{name}.retry_delay", self.retry_delay, 0, MAX_RETRY_DELAY_SECONDS)
        _check_number(f"{name}.max_retry_delay", self.max_retry_delay, self.retry_delay,
                      MAX_RETRY_DELAY_SECONDS, note=f" (at least {name}.retry_delay)")
        if isinstance(self.retry_backoff, bool) or not isinstance(self.retry_backoff, int | float) \
                or not 1 <= self.retry_backoff <= MAX_RETRY_BACKOFF:
            raise InvalidChannelSpec(f"{name}.retry_backoff must be a number from 1 to "
                                     f"{MAX_RETRY_BACKOFF}, got {self.retry_backoff!r}")

    @property
    def retry_policy(self) -> RetryPolicy:
        """Attempts and delays of this consumer's messages (the class's, `runtime.retry_delay`
        when set)."""
        delay = self.retry_delay if self.runtime.retry_delay is None else self.runtime.retry_delay
        return RetryPolicy(self.max_receives, self.max_attempts, delay, self.retry_backoff,
                           max(self.max_retry_delay, delay))

    # -- lifecycle ------------------------------------------------------------------------------
    def emit(self, name: str, message_id: str | None = None, duration: float | None = None,
             fields: dict[str, Any] | None = None) -> None:
        """Report one lifecycle event (see `on_event`); record it in the status store when the
        channel tracks status (also when a subclass's `on_event` does not call super)."""
        event = LifecycleEvent(name, self.spec.name, message_id, duration, fields)
        self.workers.count(name)
        try:
            self.on_event(event)
        except Exception:
            logger.exception("reporting lifecycle event %s failed", name)
        if self.status is not None:
            try:
                self.status.track(event)
            except Exception:
                logger.exception("recording the status of event %s failed", name)

    def transition(self, state: ConsumerState) -> None:
        """Enter `state` (no-op when already there): health file, event, hooks."""
        with self.transition_lock:
            previous = self.state
            if state is previous or previous is ConsumerState.EXITED:
                return
            if previous is ConsumerState.EXITING and state is not ConsumerState.EXITED:
                return
            self.state = state
            self._state_since = health_clock()
            if previous in RUNNING_STATES and state in RUNNING_STATES:
                self._health_dirty = True  # written within HEALTH_LAG_SECONDS (flush_health)
            else:
                self._write_health()
            self.protection.follow(state)
            self.emit("state", fields={
                "state": state.value, "previous": previous.value if previous else None,
            })
            if self.hooks:  # (twice per poll on a busy queue: no lookup without hooks)
                self.run_hooks(LifecycleHooks.for_state(state), previous)

    def touch_health(self) -> None:
        """Progress while PROCESSING: restart the state's clock in the health file."""
        with self.transition_lock:
            if self.state is ConsumerState.PROCESSING:
                self._state_since = health_clock()
                self._health_dirty = True

    def flush_health(self) -> None:
        """Write a pending change of the health file once the last write is old enough (the
        watchdog calls it every tick). Switching between LISTENING, IDLE and PROCESSING happens
        twice per poll on a busy queue; the health check needs none of them at once: it fails
        only for PROCESSING past processing_timeout + grace, and the file keeps each state's
        true start time, only written up to a second later."""
        with self.transition_lock:
            if not self._health_dirty or self.state is None:
                return
            lag = min(HEALTH_LAG_SECONDS, (self.health_timeout(ConsumerState.PROCESSING)
                                           or HEALTH_LAG_SECONDS) / 4)
            if time.monotonic() - self._health_written_at >= lag:
                self._write_health()

    def beat(self) -> None:
        """The watchdog's tick: refresh the worker-registry entry when an interval is due, or
        when its state or counts changed (at most every CHANGE_WRITE_SECONDS)."""
        state = self.state
        if state is None or not self.workers.enabled:
            return
        runtime = self._runtime
        in_flight = len(runtime.held(*Stage)) if runtime is not None else 0
        self.workers.beat(state.value, in_flight)

    def health_timeout(self, state: ConsumerState) -> float | None:
        """How long the consumer may stay in `state` before the health check fails."""
        grace = self.runtime.health_grace
        if state in (ConsumerState.INITIALIZING, ConsumerState.INITIALIZED):
            return self.runtime.startup_timeout
        if state is ConsumerState.PROCESSING:
            return float(self.processing_timeout) + grace
        if state is ConsumerState.EXITING:
            return self.runtime.shutdown_timeout + grace
        return None

    def _write_health(self) -> None:
        assert self.state is not None
        self._health_dirty = False
        self._health_written_at = time.monotonic()
        record = HealthRecord(
            state=self.state.value, since=self._state_since,
            timeout_seconds=self.health_timeout(self.state), pid=os.getpid(),
            consumer=f"{type(self).__module__}.{type(self).__qualname__}",
            written_at=health_clock(), refresh_seconds=self.runtime.health_refresh,
        )
        try:
            self.health.write(record)
        except Exception as error:  # a full disk must not stop message processing
            # The check sees it (the file goes stale, and its own write fails): logged once.
            text = f"{type(error).__name__}: {error}"
            if text != self._health_error:
                logger.error("writing health file %s failed: %s", self.health.path, text)
            self._health_error = text
        else:
            self._health_error = None

    def _refresh_health(self) -> None:
        """Rewrite the health file every `health_refresh` seconds until the consumer has
        EXITED (a thread of its own: provisioning, a busy runtime or a shutdown never delay
        it; a hung process stops it, and the check sees the file go stale)."""
        while not self._health_stop.wait(self.runtime.health_refresh):
            with self.transition_lock:
                if self.state is not None:
                    self._write_health()

    def run_hooks(self, hook: LifecycleHooks, *args: Any) -> None:
        """Call the hooks registered for `hook`; one that raises (anything, `SystemExit` and
        `KeyboardInterrupt` included: a real signal goes to the signal handler) is logged and
        skipped. A hook gets as many of `args` as its signature takes, so seed-style hooks
        such as `def hook(self)` on MSG_PROCESSING_END run too."""
        if not self.hooks:  # (twice per message: no lookup when the class has none)
            return
        for name in self.hooks.get(hook, ()):
            method = getattr(self, name)
            try:
                method(*args[: hook_arity(method, len(args))])
            except BaseException as error:  # SystemExit in a hook must not kill the worker
                message = args[0] if args and isinstance(args[0], ReceivedMessage) else None
                self.emit("hook_failed", message.message_id if message else None, fields={
                    "hook": hook.value, "method": name,
                    "error": f"{type(error).__name__}: {error}",
                    "error_class": type(error).__name__,
                })

    def check_delay(self, message: ReceivedMessage) -> None:
        if self.delay_tolerance is not None and message.lag > self.delay_tolerance:
            self.emit("delayed", message.message_id, fields={
                "lag": round(message.lag, 3), "delay_tolerance": self.delay_tolerance,
            })

    # -- running --------------------------------------------------------------------------------
    def request_shutdown(self, *_: Any) -> None:
        """Stop receiving now and shut down gracefully (what SIGTERM and SIGINT do)."""
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
        self._stop_requested.set()
        if self._runtime is not None:
            self._runtime.stop()

    def run(self) -> int:
        """Consume until SIGTERM/SIGINT or `request_shutdown()`; returns 0, also when asked to
        stop while the channel is still being resolved (however long the endpoint takes to
        answer). Raises the fatal error (e.g. ProcessingTimeout when a timed-out message cannot
        be dead-lettered) after a graceful shutdown."""
        previous = self._install_signal_handlers()
        self._health_stop.clear()
        threading.Thread(target=self._refresh_health, name="messenger-health",
                         daemon=True).start()
        try:
            self.transition(ConsumerState.INITIALIZING)
            resources = self._start_up()
            if resources is None:  # SIGTERM while provisioning: nothing is held yet
                return 0
            self.resources = resources
            self.transition(ConsumerState.INITIALIZED)
            self.workers.start(ConsumerState.INITIALIZED.value)
            mailbox, poller = self.mailboxes(self.resources)
            runtime = self.runtime_class(
                self, mailbox, PayloadStore(self.clients.client("s3"), ""), poller=poller,
                lease_sqs=self.clients.client(
                    "sqs", read_timeout=renewal_read_timeout(self.visibility_timeout)),
                # An operator's pause and cancel requests (`messenger.consume.controls`).
                control_sqs=self.clients.client("sqs", read_timeout=CONTROL_READ_TIMEOUT),
                cancels=CancelRequests(self.clients, self.settings, self.spec.name,
                                       dynamodb=self.clients.client(
                                           "dynamodb", read_timeout=CONTROL_READ_TIMEOUT)),
            )
            self._runtime = runtime
            if self._stop_requested.is_set():  # SIGTERM while initializing
                runtime.stop()
            freeze_startup_heap()
            self.transition(ConsumerState.LISTENING)
            # Lines are held only while the watchdog runs to write them: a line logged while
            # provisioning (which can take a while) is written at once.
            hold_lines(self.runtime.log_hold)
            runtime.start()
            runtime.wait()
            if runtime.fatal is not None:
                raise runtime.fatal
            return 0
        finally:
            self.transition(ConsumerState.EXITING)
            if self.status is not None:
                self.status.close(timeout=self._final_flush_seconds())
            self.workers.stop()
            if self.limits is not None:
                self.limits.close()
            self.transition(ConsumerState.EXITED)
            self._health_stop.set()  # a process still up later reads as stale: not healthy
            hold_lines(0.0)  # writes what is held; lines after the run are written at once
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _final_flush_seconds(self) -> float:
        """Seconds the status store's final write may take: what the shutdown timeout leaves
        since the stop was requested (the whole timeout after a fatal error), at least
        FINAL_STATUS_FLUSH_SECONDS."""
        left = self.runtime.shutdown_timeout
        if self._stop_requested_at is not None:
            left -= time.monotonic() - self._stop_requested_at
        return max(FINAL_STATUS_FLUSH_SECONDS, left)

    def _start_up(self) -> ChannelResources | None:
        """Resolve (auto: provision) the channel and start status tracking on a thread of
        their own; None when a shutdown is requested first. A hung endpoint holds that thread
        in a socket read that a signal cannot end: the main thread waits for it or for the
        shutdown request, whichever comes first (the thread is left to the process's exit)."""
        done = threading.Event()
        outcome: dict[str, Any] = {}

        def resolve() -> None:
            try:
                provisioner = Provisioner(self.clients, self.settings)
                outcome["resources"] = call_with_budget(
                    lambda: provisioner.ensure_channel(self.spec),
                    self.settings.retry_budget_seconds, f"resolving channel {self.spec.name!r}",
                )
                if not provisioner.auto:  # auto: the provisioning wrote this spec's declaration
                    self.check_tracking(outcome["resources"])
                if self.status is not None:
                    self.status.start(
                        writer_process=self.runtime.status_writer == "process")
                if self.idempotency is not None:  # a missing table stops the start, once
                    self.idempotency.ensure()
                self.start_limits(outcome["resources"])
            except BaseException as error:  # raised on the main thread
                outcome["error"] = error
            finally:
                done.set()

        threading.Thread(target=resolve, name="messenger-startup", daemon=True).start()
        while not done.wait(STARTUP_POLL_SECONDS):
            if self._stop_requested.is_set():
                return None
        if "error" in outcome:
            raise outcome["error"]
        resources: ChannelResources = outcome["resources"]
        return resources

    def start_limits(self, resources: ChannelResources) -> None:
        """The limit gate (`messenger.consume.limits`), when the channel declares a limit: its
        deployed queue's declaration (tags), else this class's; none otherwise (no limits-table
        call at all). Both runtimes call it once the channel is resolved."""
        from messenger.jobs.limits import ChannelLimits

        declared = ChannelLimits.of_spec(self.spec)
        try:
            tags = self.clients.client("sqs").list_queue_tags(
                QueueUrl=resources.queue.url).get("Tags") or {}
        except Exception:  # (tags not readable: the class's declaration)
            tags = {}
        deployed = ChannelLimits.of_tags(tags)
        if deployed.limited:
            declared = deployed
        if not declared.limited:
            return
        from messenger.consume.limits import LimitGate, concurrency_cap
        from messenger.consume.tracking import consumer_id
        from messenger.jobs.limits import LimitStore

        store = LimitStore(self.clients, self.settings)
        store.ensure()
        holder = f"{consumer_id()}-{id(self):x}"  # (two consumers of one process: two)
        self.limits = LimitGate(store, self.spec.name, declared, holder,
                                cloudwatch=self.clients.client("cloudwatch"),
                                workers=self.runtime.concurrency, cap=concurrency_cap())
        self.limits.start()

    def mailboxes(self, resources: ChannelResources,
                  sqs: Any = None) -> tuple[Mailbox, LevelPoller | None]:
        """The default level's mailbox, and a poller over every level's (prioritized channel):
        the SQS calls of either runtime (Fargate's `run`, `LambdaConsumerRuntime`).
        sqs: their client (default: a long-polling one; Lambda, which never receives, passes
        the client that resolved the channel rather than make another at its cold start)."""
        def mailbox(found: ChannelResources) -> Mailbox:
            # The mailbox builds its requests from values checked already (settings, receipt
            # handles SQS gave): botocore's check of each parameter is skipped.
            client = sqs or self.clients.client("sqs", long_poll=True, validate_params=False)
            return Mailbox(client, found.queue.url, found.dlq.url, self.ordered,
                           self.settings.retry_budget_seconds, level=found.spec.priority_level)

        if self.policy is None:
            return mailbox(resources), None
        levels = [mailbox(level) for level in resources.levels]
        default = next(box for box in levels if box.level == self.spec.default_level)
        return default, LevelPoller(levels, self.policy)

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, self.request_shutdown)
        return previous


def _check_number(
    what: str, value: Any, low: float, high: float, whole: bool = False, note: str = ""
) -> None:
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        kind = "a whole number" if whole else "a number"
        raise InvalidChannelSpec(f"{what} must be {kind} from {low:g} to {high:g} seconds"
                                 f"{note}, got {value!r}")


def _check_final_errors(what: str, value: Any) -> None:
    """A tuple of exception classes (messenger.Unrecoverable is final without being named)."""
    if not isinstance(value, tuple) or not all(
            isinstance(item, type) and issubclass(item, BaseException) for item in value):
        raise InvalidChannelSpec(f"{what} must be a tuple of exception classes, e.g. "
                                 f"(ValueError, KeyError), got {value!r}")


def _check_count(what: str, value: Any, high: int, limit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InvalidChannelSpec(f"{what} must be a whole number from 1 to {high} ({limit}), "
                                 f"got {value!r}")


def load_consumer(target: str) -> type[Consumer]:
    """The Consumer subclass named by 'package.module:ClassName'."""
    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise InvalidSettings(f"consumer {target!r} must be 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # whatever the module raises on import: one line, not a traceback
        where = ""
        frames = traceback.extract_tb(error.__traceback__)
        if frames and not isinstance(error, ModuleNotFoundError):
            where = f" (at {frames[-1].filename}:{frames[-1].lineno})"
        raise InvalidSettings(f"cannot import {module_name!r} for consumer {target!r}: "
                              f"{type(error).__name__}: {error}{where}") from None
    found = getattr(module, class_name, None)
    if found is None:
        defined = sorted(n for n, v in vars(module).items() if isinstance(v, type)
                         and issubclass(v, Consumer) and v is not Consumer)
        raise InvalidSettings(f"module {module_name!r} has no {class_name!r} (its Consumer "
                              f"subclasses: {', '.join(defined) or 'none'})")
    if not isinstance(found, type) or not issubclass(found, Consumer):
        kind = "a class" if isinstance(found, type) else f"a {type(found).__name__}"
        raise InvalidSettings(f"{target!r} is {kind}, not a Consumer subclass")
    return found


def run_cli(args: argparse.Namespace) -> int:
    """`messenger consume package.module:Class`: run one consumer until SIGTERM (exit 0)."""
    configure_json_logging(logging.DEBUG if getattr(args, "verbose", False) else logging.INFO)
    cls = load_consumer(args.consumer)
    cls.check_runtime_defaults()
    overrides = {
        name: value for name, value in (
            ("concurrency", args.concurrency), ("shutdown_timeout", args.shutdown_timeout),
            ("health_file", args.health_file),
        ) if value is not None
    }
    runtime = ConsumerSettings.from_env(
        concurrency=cls.concurrency, shutdown_timeout=cls.shutdown_timeout
    )
    consumer = cls(runtime=replace(runtime, **overrides))
    try:
        return consumer.run()
    except Exception as error:
        logger.error("consumer %s stopped: %s: %s", args.consumer, type(error).__name__, error)
        return 1
