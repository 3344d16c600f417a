"""Consumer lifecycle: states, hooks, lifecycle events and their structured JSON log.

States run INITIALIZING → INITIALIZED → LISTENING ⇄ PROCESSING → IDLE … → EXITING → EXITED:

| state        | meaning                                                            |
|--------------|--------------------------------------------------------------------|
| INITIALIZING | resolving (auto: provisioning) the channel                         |
| INITIALIZED  | channel ready, workers starting                                    |
| LISTENING    | long polling, nothing in flight                                    |
| PROCESSING   | at least one message received and not finished                     |
| IDLE         | nothing in flight and the last poll came back empty                |
| EXITING      | shutdown requested: no new message starts, in-flight work finishes |
| EXITED       | done; the process is about to exit                                 |

Hooks are consumer methods marked with `@register_hook(LifecycleHooks.X)`. A state hook is called
as `hook(self, previous_state)` when the consumer enters that state; MSG_PROCESSING_START/END as
`hook(self, message)` in the worker thread around the handler; ON_PROCESSING_TIMEOUT as
`hook(self, message)`; ON_ERROR as `hook(self, message, error)` (message None when the error is not
about one message). A hook that raises is logged and skipped.
"""

from __future__ import annotations

import enum
import inspect
import json
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

HOOKS_ATTRIBUTE = "_messenger_hooks"


class ConsumerState(enum.Enum):
    INITIALIZING = "INITIALIZING"
    INITIALIZED = "INITIALIZED"
    LISTENING = "LISTENING"
    PROCESSING = "PROCESSING"
    IDLE = "IDLE"
    #: An operator paused the channel (`messenger pause`): not receiving, nothing held.
    PAUSED = "PAUSED"
    EXITING = "EXITING"
    EXITED = "EXITED"


class LifecycleHooks(enum.Enum):
    """What a hook is registered for: entering a state, or a point in a message's processing."""

    INITIALIZING = "INITIALIZING"
    INITIALIZED = "INITIALIZED"
    LISTENING = "LISTENING"
    PROCESSING = "PROCESSING"
    IDLE = "IDLE"
    PAUSED = "PAUSED"
    EXITING = "EXITING"
    EXITED = "EXITED"
    MSG_PROCESSING_START = "MSG_PROCESSING_START"
    MSG_PROCESSING_END = "MSG_PROCESSING_END"
    ON_PROCESSING_TIMEOUT = "ON_PROCESSING_TIMEOUT"
    ON_ERROR = "ON_ERROR"

    @classmethod
    def for_state(cls, state: ConsumerState) -> LifecycleHooks:
        return cls(state.value)


def register_hook(*hooks: LifecycleHooks) -> Callable[[F], F]:
    """Mark a consumer method as a hook for one or more lifecycle points."""
    for hook in hooks:
        if not isinstance(hook, LifecycleHooks):
            raise TypeError(
                f"register_hook takes LifecycleHooks members, got {hook!r}; one of "
                f"{', '.join(h.name for h in LifecycleHooks)}"
            )
    if not hooks:
        raise TypeError("register_hook needs at least one LifecycleHooks member")

    def mark(function: F) -> F:
        marked = list(getattr(function, HOOKS_ATTRIBUTE, ()))
        marked.extend(hooks)
        setattr(function, HOOKS_ATTRIBUTE, tuple(marked))
        return function

    return mark


def hook_arity(method: Callable[..., Any], offered: int) -> int:
    """How many of `offered` positional arguments a (bound) hook method takes."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature (a builtin): offer everything
        return offered
    count = 0
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return offered
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY,
                              inspect.Parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return min(count, offered)


def collect_hooks(cls: type) -> dict[LifecycleHooks, list[str]]:
    """Hook method names of a class per lifecycle point, base classes first, in definition order."""
    found: dict[LifecycleHooks, list[str]] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            for hook in getattr(value, HOOKS_ATTRIBUTE, ()):
                names = found.setdefault(hook, [])
                if name in names:  # overridden in a subclass: keep the first position
                    continue
                names.append(name)
    # A subclass that overrides a hook method without re-decorating it gets its override called.
    return found


# -- lifecycle events ---------------------------------------------------------------------------
#: The lifecycle events of a message (plus 'state' for consumer transitions and a few warnings).
MESSAGE_EVENTS = (
    "received", "started", "completed", "failed", "retried", "timed_out", "dead_lettered",
    "released", "delayed", "delete_failed", "heartbeat_failed", "lease_lapsed",
    "duplicate_skipped", "duplicate_in_progress",
)


@dataclass(frozen=True, init=False)
class LifecycleEvent:
    """One thing that happened to a message or to the consumer, as logged.

    name: one of MESSAGE_EVENTS, 'state' or 'hook_failed'. duration: seconds since the message
    started (completed/failed/timed_out) or None. fields: anything else worth logging ({} when
    None). at: epoch seconds (now when None).
    """

    name: str
    channel: str
    message_id: str | None = None
    duration: float | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)

    def __init__(self, name: str, channel: str, message_id: str | None = None,
                 duration: float | None = None, fields: dict[str, Any] | None = None,
                 at: float | None = None) -> None:
        # The generated __init__ of a frozen dataclass sets each field through
        # object.__setattr__; three events per message make that a tenth of their cost.
        values = self.__dict__
        values["name"] = name
        values["channel"] = channel
        values["message_id"] = message_id
        values["duration"] = duration
        values["fields"] = {} if fields is None else fields
        values["at"] = time.time() if at is None else at

    @property
    def level(self) -> int:
        return _EVENT_LEVELS.get(self.name, logging.INFO)

    def as_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"event": self.name, "channel": self.channel}
        if self.message_id is not None:
            record["message_id"] = self.message_id
        if self.duration is not None:
            record["duration"] = round(self.duration, 6)
        record.update(self.fields)
        return record


EVENT_LOGGER = logging.getLogger("messenger.consumer.events")
#: Events logged above INFO; every other event is INFO.
_EVENT_LEVELS = {
    **dict.fromkeys(("failed", "timed_out", "dead_lettered", "hook_failed", "delete_failed",
                     "heartbeat_failed", "lease_lapsed", "fatal", "idempotency_record_failed"),
                    logging.ERROR),
    **dict.fromkeys(("retried", "delayed", "released", "stalled", "shutdown_incomplete"),
                    logging.WARNING),
}


_polls = threading.local()


@contextmanager
def one_received_line() -> Iterator[None]:
    """Log the 'received' events this thread logs inside as one line per channel at the end:
    a poll's messages (see `received_line`). `on_event` still gets each event as it happens.
    CPU optimisation (and fewer lines): the plain path is one 'received' line per message."""
    held: list[tuple[LifecycleEvent, logging.Logger]] = []
    _polls.held = held
    try:
        yield
    finally:
        _polls.held = None
        lines: dict[tuple[str, logging.Logger], list[LifecycleEvent]] = {}
        for event, logger in held:
            lines.setdefault((event.channel, logger), []).append(event)
        for (_, logger), events in lines.items():
            log_event(received_line(events), logger)


def received_line(events: list[LifecycleEvent]) -> LifecycleEvent:
    """The 'received' events of one poll as one event to log: `message_ids` and
    `receive_counts` (in the same order), `group_ids` when any has one (ordered channels), and
    the other fields: one value when the events share it (a poll's `priority`), else a list."""
    first = events[0]
    fields: dict[str, Any] = {
        "count": len(events),
        "message_ids": [event.message_id for event in events],
        "receive_counts": [event.fields.get("receive_count") for event in events],
    }
    groups = [event.fields.get("group_id") for event in events]
    if any(group is not None for group in groups):
        fields["group_ids"] = groups
    for key, value in first.fields.items():
        if key not in ("receive_count", "group_id"):
            values = [event.fields.get(key) for event in events]
            fields[key] = value if values.count(value) == len(values) else values
    return LifecycleEvent("received", first.channel, None, None, fields, at=first.at)


def log_event(event: LifecycleEvent, logger: logging.Logger = EVENT_LOGGER) -> None:
    """Log a lifecycle event as one structured record (the JSON formatter renders its fields);
    inside `one_received_line`, a 'received' event is held for that poll's line.

    When the only handler the record would reach is `configure_json_logging`'s, with no
    filters, the line is written straight away: the same JSON line, without building a
    `LogRecord` (a third of the cost of an event; CPU optimisation: the plain path is the
    `logger.log` below). Any other logging setup gets the record
    through `logging` as usual."""
    if event.name == "received":
        held = getattr(_polls, "held", None)
        if held is not None:
            held.append((event, logger))
            return
    level = _EVENT_LEVELS.get(event.name, logging.INFO)  # event.level, without the call
    if not logger.isEnabledFor(level):
        return
    handler = _sole_json_handler(logger, level)
    if handler is not None:
        handler.write_event(event, level, logger.name)
    else:
        logger.log(level, event.name, extra={"event_fields": event.as_dict()})


def _sole_json_handler(logger: logging.Logger, level: int) -> JsonLinesHandler | None:
    """The handler a record of `logger` would reach, when it is one JsonLinesHandler and no
    logger or handler on the way filters (once per event: no lists, no generators)."""
    found: logging.Handler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if level >= handler.level:
                if found is not None:
                    return None
                found = handler
        if not current.propagate:
            break
        current = current.parent  # type: ignore[assignment]
    if isinstance(found, JsonLinesHandler) and not found.filters:
        return found
    return None


def _line_encoder() -> Callable[[Any], str]:
    """`json.dumps(value, default=str)` without building an encoder per line: the C encoder
    `json.JSONEncoder.encode` builds on every call, built once (a circular value raises
    RecursionError instead of ValueError); Python's encoder where there is no C one."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(default=str).encode
    encoder = make(None, str, json.encoder.encode_basestring_ascii, None, ": ", ", ",
                   False, False, True)
    return lambda value: "".join(encoder(value, 0))


_encode = _line_encoder()


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, lifecycle fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
        }
        fields = getattr(record, "event_fields", None)
        if fields:
            payload.update(fields)
        else:
            payload["message"] = record.getMessage()
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return _encode(payload)


#: The keys of a lifecycle line besides an event's fields (`JsonLinesHandler._line`).
_STANDARD_KEYS = frozenset({"time", "level", "logger", "event", "channel", "message_id",
                            "duration"})
#: Line heads (level, logger, event, channel) a handler keeps ready.
MAX_CACHED_HEADS = 4096
_string = json.encoder.encode_basestring_ascii


def _number(value: float) -> str:
    """A float as the line encoder writes it (repr; NaN and infinities its way)."""
    return float.__repr__(value) if value - value == 0.0 else _encode(value)


#: Lines a handler holds at most before it writes them, whatever their age.
MAX_HELD_LINES = 256
#: Events that end a handler's run: a held `started` line of the same message is dropped, since
#: this line tells when the run started (its `time` less its `duration`).
RUN_ENDS = frozenset({"completed", "failed", "timed_out", "dead_lettered"})

_handlers: weakref.WeakSet[JsonLinesHandler] = weakref.WeakSet()
_handlers_lock = threading.Lock()


def _json_handlers() -> list[JsonLinesHandler]:
    with _handlers_lock:
        return list(_handlers)


class JsonLinesHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """`configure_json_logging`'s handler: JSON lines on a stream; lifecycle events can be
    written without a `LogRecord` (`log_event`), in the JsonFormatter's format.

    hold_seconds: INFO lifecycle lines are held in memory up to this long and written together
    (one write instead of one per line: a write lets the other threads take the GIL, which
    costs a busy consumer more CPU than the line itself). They are written when the oldest is
    that old (at the next line, or by `write_held_lines`, which a running consumer's watchdog
    calls every tick), before any WARNING or ERROR line or ordinary log record, when
    MAX_HELD_LINES are held, on `flush()` and at exit. A `started` line still held when its
    message's run ends (RUN_ENDS) is not written: a fast handler's message costs one line, a
    handler still running when the lines go out has its `started` line. Lines are encoded when
    written. 0 (the default until a consumer runs, see `hold_lines`): every line is written at
    once.

    CPU optimisation: the plain path is `hold_seconds=0` and `JsonFormatter.format` of each
    record; holding lines, dropping fast `started` lines and `_line`'s cached heads only save
    CPU (the lines written are the formatter's)."""

    def __init__(self, stream: Any = None, hold_seconds: float = 0.0) -> None:
        super().__init__(stream)
        self.setFormatter(JsonFormatter())
        self.hold_seconds = hold_seconds
        self._held: list[tuple[LifecycleEvent, int, str] | None] = []
        self._held_since = 0.0
        #: (channel, message id) of each held `started` line → its index in `_held`
        self._started: dict[tuple[str, str], int] = {}
        self._heads: dict[tuple[int, str, str, str], str] = {}
        with _handlers_lock:
            _handlers.add(self)

    def write_event(self, event: LifecycleEvent, level: int, logger_name: str) -> None:
        with self.lock:  # type: ignore[union-attr]  # (createLock made it; acquire() in C)
            try:
                held = self._held
                now = time.monotonic()
                if not held:
                    self._held_since = now
                if event.message_id is not None:
                    if event.name == "started":
                        self._started[(event.channel, event.message_id)] = len(held)
                    elif event.name in RUN_ENDS:
                        index = self._started.pop((event.channel, event.message_id), None)
                        if index is not None:
                            held[index] = None
                held.append((event, level, logger_name))
                if level >= logging.WARNING or len(held) >= MAX_HELD_LINES or \
                        now - self._held_since >= self.hold_seconds:
                    self._write_held()
            except Exception:
                self.handleError(logging.makeLogRecord({"msg": event.name}))

    def _line(self, event: LifecycleEvent, level: int, logger_name: str) -> str:
        """The JsonFormatter's line for an event: the same text as encoding the record's
        payload, built from a cached head (level, logger, event, channel) and the event's own
        values (half the cost); an event whose fields would replace a standard key, or whose
        values are not plain, takes the payload's way."""
        at, message_id, duration, fields = event.at, event.message_id, event.duration, \
            event.fields
        if type(at) is not float or not (message_id is None or type(message_id) is str) or \
                not (duration is None or type(duration) is float) or \
                (fields and not _STANDARD_KEYS.isdisjoint(fields)):
            payload = {"time": round(at, 3), "level": logging.getLevelName(level),
                       "logger": logger_name, **event.as_dict()}
            return _encode(payload) + self.terminator
        key = (level, logger_name, event.name, event.channel)
        head = self._heads.get(key)
        if head is None:
            if len(self._heads) >= MAX_CACHED_HEADS:
                self._heads.clear()
            head = self._heads[key] = ", " + _encode({
                "level": logging.getLevelName(level), "logger": logger_name,
                "event": event.name, "channel": event.channel})[1:-1]
        parts = ['{"time": ', _number(round(at, 3)), head]
        if message_id is not None:
            parts += [', "message_id": ', _string(message_id)]
        if duration is not None:
            parts += [', "duration": ', _number(round(duration, 6))]
        parts.append(", " + _encode(fields)[1:] if fields else "}")
        parts.append(self.terminator)
        return "".join(parts)

    def _write_held(self) -> None:
        """Write the held lines in one write (the handler's lock held). An event that cannot
        be encoded is reported like any failed record and left out; the others are written."""
        if not self._held:
            return
        held, self._held = self._held, []
        self._started.clear()
        lines = []
        for entry in held:
            if entry is None:
                continue
            try:
                lines.append(self._line(*entry))
            except Exception:
                self.handleError(logging.makeLogRecord({"msg": entry[0].name}))
        if lines and self.stream is not None:
            self.stream.write("".join(lines))
            self.stream.flush()

    def write_held(self, older_than: float = 0.0) -> None:
        """Write the held lines now if the oldest is at least `older_than` seconds old."""
        self.acquire()
        try:
            if self._held and time.monotonic() - self._held_since >= older_than:
                self._write_held()
        except Exception:
            self.handleError(logging.makeLogRecord({"msg": "held lines"}))
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        # An ordinary record: the held lines go first, so that the log stays in order.
        try:
            self._write_held()
        except Exception:
            self.handleError(record)
        super().emit(record)

    def flush(self) -> None:
        self.acquire()
        try:
            self._write_held()
        finally:
            self.release()
        super().flush()


def hold_lines(seconds: float) -> None:
    """Set how long every JsonLinesHandler of the process holds INFO lifecycle lines (a
    running consumer sets its `log_hold`; 0: each line is written at once)."""
    for handler in _json_handlers():
        handler.hold_seconds = seconds
        handler.write_held()  # a broken stream is reported there; the consumer runs on


def write_held_lines(within: float = 0.0) -> None:
    """Write the held lines of every JsonLinesHandler that would be due within `within`
    seconds (a consumer's watchdog calls this every tick, with the tick)."""
    for handler in _json_handlers():
        handler.write_held(max(0.0, handler.hold_seconds - within))


def configure_json_logging(level: int = logging.INFO) -> None:
    """Route every log record of the process to stderr as JSON lines (replaces other handlers)."""
    handler = JsonLinesHandler(sys.stderr)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # botocore's own INFO chatter (credential lookups) is noise in a consumer's log.
    logging.getLogger("botocore").setLevel(max(level, logging.WARNING))
