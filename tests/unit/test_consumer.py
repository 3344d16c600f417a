"""Consumer definition: class attributes, validation, settings, hooks, the JSON log."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest

from messenger import (
    ChannelTags,
    Consumer,
    ConsumerSettings,
    ConsumerState,
    InvalidChannelSpec,
    InvalidSettings,
    LifecycleHooks,
    MessageFilter,
    Settings,
    register_hook,
)
from messenger.consume.consumer import load_consumer
from messenger.consume.lifecycle import JsonFormatter, LifecycleEvent, collect_hooks, log_event
from messenger.consume.mailbox import Delivery, Stage
from messenger.message import sendable_attributes

SETTINGS = Settings(namespace="unit")


class MobileEvents(Consumer):
    channel = "wishlist_events_exchange.process_mobile_events"
    ordered = True
    delay = 30
    message_filter = MessageFilter(filter_type="prefix", values=["MOBILE."])
    processing_timeout = 60
    delay_tolerance = 120
    tags = ChannelTags(owner="alice", team="wishlist")

    def handler(self, message: Any) -> None:
        pass


def make(cls: type[Consumer], **runtime: Any) -> Consumer:
    return cls(settings=SETTINGS, runtime=ConsumerSettings(**runtime))


def test_channel_spec_comes_from_the_class_attributes_and_namespace():
    spec = make(MobileEvents).spec
    assert spec.name == "wishlist_events_exchange.process_mobile_events"
    assert spec.ordered and spec.delay == 30 and spec.namespace == "unit"
    assert spec.queue_name == "unit-process_mobile_events.fifo"
    assert spec.topic_name == "unit-wishlist_events_exchange.fifo"
    assert spec.filter_policy() == {"routing_key": [{"prefix": "MOBILE."}]}
    assert spec.visibility_timeout == 30  # the consumer default, extended by the heartbeat
    assert spec.tags.owner == "alice"


@pytest.mark.parametrize("value", [0, 0.5, 1801, "60", None, True])
def test_processing_timeout_outside_1_to_1800_is_refused_naming_the_field(value):
    cls = type("Bad", (MobileEvents,), {"processing_timeout": value})
    with pytest.raises(InvalidChannelSpec, match=r"Bad\.processing_timeout must be .* 1 to 1800"):
        make(cls)


def test_processing_timeout_bounds_are_accepted():
    for value in (1, 1800, 2.5):
        make(type("Ok", (MobileEvents,), {"processing_timeout": value}))


@pytest.mark.parametrize("value", [1, 0, 43201, 2.5])
def test_visibility_timeout_must_leave_room_for_the_heartbeat(value):
    cls = type("Bad", (MobileEvents,), {"visibility_timeout": value})
    with pytest.raises(InvalidChannelSpec, match=r"visibility_timeout must be a whole number"):
        make(cls)


def test_channel_and_handler_are_required():
    class NoChannel(Consumer):
        def handler(self, message: Any) -> None:
            pass

    class NoHandler(Consumer):
        channel = "orders"

    with pytest.raises(InvalidChannelSpec, match="channel must name a channel"):
        make(NoChannel)
    with pytest.raises(InvalidChannelSpec, match="must define handler"):
        make(NoHandler)


def test_channel_errors_come_from_the_channel_spec():
    cls = type("Bad", (MobileEvents,), {"delay": 901})
    with pytest.raises(InvalidChannelSpec, match="delay must be from 0 to 900"):
        make(cls)


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"concurrency": 0}, r"concurrency \(MESSENGER_CONCURRENCY\) must be a whole number >= 1"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"shutdown_timeout": 0},
         r"shutdown_timeout \(MESSENGER_SHUTDOWN_TIMEOUT\) must be a finite number of seconds > 0"),
        ({"shutdown_timeout": "abc"}, r"shutdown_timeout .* got 'abc'"),
        ({"health_grace": float("nan")}, r"health_grace \(MESSENGER_HEALTH_GRACE\) .* got nan"),
        ({"startup_timeout": float("inf")}, "startup_timeout"),
        ({"stuck_grace": float("nan")}, "stuck_grace"),
        ({"startup_timeout": -1}, "startup_timeout"),
        ({"health_grace": -1}, "health_grace"),
        ({"wait_time_seconds": 21}, "wait_time_seconds must be from 0 to 20"),
    ],
)
def test_runtime_settings_are_validated(changes, pattern):
    with pytest.raises(InvalidSettings, match=pattern):
        ConsumerSettings(**changes)


@pytest.mark.parametrize("raw", ["nan", "inf", "-1"])
def test_a_health_grace_that_never_runs_out_is_rejected_from_the_environment(raw):
    with pytest.raises(InvalidSettings, match="MESSENGER_HEALTH_GRACE"):
        ConsumerSettings.from_env({"MESSENGER_HEALTH_GRACE": raw})


def test_runtime_settings_from_environment_override_class_defaults():
    env = {
        "MESSENGER_CONCURRENCY": "8",
        "MESSENGER_SHUTDOWN_TIMEOUT": "25",
        "MESSENGER_HEALTH_FILE": "/var/run/h.json",
        "MESSENGER_HEALTH_GRACE": "5",
    }
    settings = ConsumerSettings.from_env(env, concurrency=2, shutdown_timeout=None)
    assert (settings.concurrency, settings.shutdown_timeout) == (8, 25.0)
    assert settings.health_file == "/var/run/h.json" and settings.health_grace == 5.0
    assert settings.stuck_after == 25.0
    defaults = ConsumerSettings.from_env({}, concurrency=2, shutdown_timeout=None)
    assert (defaults.concurrency, defaults.shutdown_timeout) == (2, 30.0)
    assert defaults.health_file is None  # one per consumer class (default_health_file)
    with pytest.raises(InvalidSettings, match="MESSENGER_CONCURRENCY must be a number"):
        ConsumerSettings.from_env({"MESSENGER_CONCURRENCY": "many"})


def test_health_timeouts_per_state():
    consumer = make(MobileEvents, health_grace=10, shutdown_timeout=20, startup_timeout=90)
    assert consumer.health_timeout(ConsumerState.INITIALIZING) == 90
    assert consumer.health_timeout(ConsumerState.INITIALIZED) == 90
    assert consumer.health_timeout(ConsumerState.PROCESSING) == 70
    assert consumer.health_timeout(ConsumerState.EXITING) == 30
    assert consumer.health_timeout(ConsumerState.LISTENING) is None
    assert consumer.health_timeout(ConsumerState.IDLE) is None


def test_hooks_are_collected_in_definition_order_including_base_classes():
    class Base(MobileEvents):
        @register_hook(LifecycleHooks.MSG_PROCESSING_START)
        def first(self, message: Any) -> None:
            pass

    class Child(Base):
        @register_hook(LifecycleHooks.MSG_PROCESSING_START, LifecycleHooks.MSG_PROCESSING_END)
        def second(self, message: Any) -> None:
            pass

    hooks = collect_hooks(Child)
    assert hooks[LifecycleHooks.MSG_PROCESSING_START] == ["first", "second"]
    assert hooks[LifecycleHooks.MSG_PROCESSING_END] == ["second"]


def test_register_hook_refuses_anything_but_lifecycle_hooks():
    with pytest.raises(TypeError, match="LifecycleHooks members"):
        register_hook("MSG_PROCESSING_START")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="at least one"):
        register_hook()


def test_transitions_write_the_health_file_and_run_state_hooks(tmp_path):
    seen: list[tuple[str, Any]] = []

    class Tracked(MobileEvents):
        @register_hook(LifecycleHooks.PROCESSING, LifecycleHooks.EXITED)
        def note(self, previous: Any) -> None:
            seen.append((self.state.value, previous))

        @register_hook(LifecycleHooks.LISTENING)
        def broken(self, previous: Any) -> None:
            raise RuntimeError("bad hook")

    consumer = make(Tracked, health_file=str(tmp_path / "h.json"))
    events: list[LifecycleEvent] = []
    consumer.on_event = events.append  # type: ignore[method-assign]
    for state in (ConsumerState.INITIALIZING, ConsumerState.LISTENING, ConsumerState.PROCESSING,
                  ConsumerState.PROCESSING, ConsumerState.EXITING, ConsumerState.LISTENING,
                  ConsumerState.EXITED):
        consumer.transition(state)
    written = json.loads((tmp_path / "h.json").read_text())
    assert written["state"] == "EXITED" and written["timeout_seconds"] is None
    assert written["consumer"].endswith("Tracked")
    # PROCESSING entered once; nothing but EXITED follows EXITING; the broken hook is logged
    assert seen == [("PROCESSING", ConsumerState.LISTENING), ("EXITED", ConsumerState.EXITING)]
    states = [e.fields["state"] for e in events if e.name == "state"]
    assert states == ["INITIALIZING", "LISTENING", "PROCESSING", "EXITING", "EXITED"]
    [failure] = [e for e in events if e.name == "hook_failed"]
    assert failure.fields["hook"] == "LISTENING" and "bad hook" in failure.fields["error"]


def test_lifecycle_events_are_one_json_object_per_line(caplog):
    formatter = JsonFormatter()
    with caplog.at_level(logging.INFO, logger="messenger.consumer.events"):
        log_event(LifecycleEvent("completed", "orders", "m-1", 0.25, {"receive_count": 2}))
    line = formatter.format(caplog.records[-1])
    assert "\n" not in line
    record = json.loads(line)
    assert record["event"] == "completed" and record["channel"] == "orders"
    assert record["message_id"] == "m-1" and record["duration"] == 0.25
    assert record["receive_count"] == 2 and record["level"] == "INFO"
    assert LifecycleEvent("timed_out", "orders").level == logging.ERROR
    assert LifecycleEvent("retried", "orders").level == logging.WARNING


def test_a_polls_received_events_are_logged_as_one_line_in_their_order(caplog):
    from messenger.consume.lifecycle import one_received_line

    def received(message_id: str, count: int, group: str | None) -> LifecycleEvent:
        return LifecycleEvent("received", "orders", message_id, None,
                              {"receive_count": count, "group_id": group, "priority": "high"})

    # Given a poll's three messages (one redelivered) of one group, and a warning among them
    with caplog.at_level(logging.INFO, logger="messenger.consumer.events"):
        with one_received_line():
            log_event(received("m-1", 1, "g"))
            log_event(received("m-2", 3, "g"))
            log_event(LifecycleEvent("delayed", "orders", "m-2", None, {"lag": 9.0}))
            log_event(received("m-3", 1, "g"))
        log_event(received("m-4", 1, None))  # outside: a line of its own, as before
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    # Then the warning is written at once, the poll's messages in one line after it
    assert [line["event"] for line in lines] == ["delayed", "received", "received"]
    poll = lines[1]
    assert (poll["count"], poll["message_ids"], poll["receive_counts"], poll["group_ids"],
            poll["priority"]) == (3, ["m-1", "m-2", "m-3"], [1, 3, 1], ["g", "g", "g"], "high")
    assert "message_id" not in poll
    assert lines[2]["message_id"] == "m-4" and lines[2]["receive_count"] == 1


def test_load_consumer_names_what_is_wrong():
    found = load_consumer("tests.integration.consumer_apps.apps:SleepyConsumer")
    assert found.__name__ == "SleepyConsumer" and issubclass(found, Consumer)
    with pytest.raises(InvalidSettings, match="must be 'package.module:ClassName'"):
        load_consumer("tests.integration.consumer_apps.apps")
    with pytest.raises(InvalidSettings, match="cannot import 'no_such_module_x'"):
        load_consumer("no_such_module_x:C")
    with pytest.raises(InvalidSettings, match="is a function, not a Consumer subclass"):
        load_consumer("tests.integration.consumer_apps.apps:record")


def test_delivery_claim_lets_only_one_thread_finish_a_message():
    delivery = Delivery({"ReceiptHandle": "r", "MessageId": "m"}, 0.0, 30.0, Stage.RUNNING)
    assert delivery.claim(Stage.RUNNING, Stage.TIMED_OUT)
    assert not delivery.claim(Stage.RUNNING, Stage.DONE)
    assert delivery.stage is Stage.TIMED_OUT
    assert delivery.log_id == "m"


def test_received_attributes_are_sent_back_in_sendmessage_shape():
    received = {
        "routing_key": {"StringValue": "MOBILE.X", "DataType": "String",
                        "StringListValues": [], "BinaryListValues": []},
        "blob": {"BinaryValue": b"\x00", "DataType": "Binary"},
    }
    assert sendable_attributes(received) == {
        "routing_key": {"DataType": "String", "StringValue": "MOBILE.X"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00"},
    }


def test_long_running_consumers_may_run_up_to_sqs_in_flight_limit():
    # Opt-in: up to 12 h in flight less the lease and a minute (the last renewal must fit)
    make(type("Long", (MobileEvents,), {"long_running": True, "processing_timeout": 6 * 3600}))
    make(type("Edge", (MobileEvents,), {"long_running": True, "processing_timeout": 43_110}))
    too_long = type("TooLong", (MobileEvents,), {"long_running": True,
                                                 "processing_timeout": 43_111})
    with pytest.raises(InvalidChannelSpec, match=r"TooLong\.processing_timeout .* 1 to 43110 "
                                                 r"seconds \(long_running: SQS's 12-hour"):
        make(too_long)
    # Without the opt-in the 1800 s limit says how to go beyond it
    with pytest.raises(InvalidChannelSpec, match=r"1 to 1800 seconds; set long_running = True"):
        make(type("Short", (MobileEvents,), {"processing_timeout": 7200}))
    with pytest.raises(InvalidChannelSpec, match=r"Odd\.long_running must be True or False"):
        make(type("Odd", (MobileEvents,), {"long_running": "yes"}))


def test_the_fast_event_line_is_the_formatter_line_and_other_setups_still_get_records():
    import io

    from messenger.consume.lifecycle import JsonLinesHandler, configure_json_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_json_logging()
        stream = io.StringIO()
        (handler,) = root.handlers
        assert isinstance(handler, JsonLinesHandler)
        handler.setStream(stream)
        event = LifecycleEvent("completed", "orders", "m-1", 0.25, {"receive_count": 2})
        log_event(event)
        fast = json.loads(stream.getvalue())
        # The same line through a LogRecord, as any other setup gets it
        record = logging.LogRecord("messenger.consumer.events", logging.INFO, "", 0,
                                   "completed", None, None)
        record.event_fields = event.as_dict()
        record.created = event.at
        assert fast == json.loads(JsonFormatter().format(record))
        # A filter anywhere on the way: the record goes through logging, and is filtered
        seen: list[logging.LogRecord] = []
        handler.addFilter(lambda r: seen.append(r) or False)
        log_event(event)
        assert len(seen) == 1 and stream.getvalue().count("\n") == 1
    finally:
        root.handlers[:], root.level = saved


@pytest.mark.parametrize("event", [
    LifecycleEvent("completed", "orders", "m-1", 0.0012345678, {"receive_count": 2}),
    LifecycleEvent("state", "wishlist_events.audit_log", None, None,
                   {"state": "LISTENING", "previous": None}),
    LifecycleEvent("started", "cafés\"\\", "é\n\t", None, {}),
    LifecycleEvent("timed_out", "orders", "m-2", float("inf"),
                   {"nested": {"list": [1, 2.5, "ü", None]}, "nan": float("nan")}),
    LifecycleEvent("failed", "orders", "m-3", float("nan"), {"error": object()}),
    LifecycleEvent("custom", "orders", None, None, {"event": "renamed", "time": 1}),
    LifecycleEvent("custom", "orders", 7, 3, {}),  # type: ignore[arg-type]
    LifecycleEvent("custom", "orders", "m-4", None, {}, at=1_700_000_000),
])
def test_an_event_line_is_exactly_the_formatters_line(event):
    """The handler builds a lifecycle line from a cached head instead of encoding a payload:
    byte for byte what JsonFormatter writes for the same record, odd values included."""
    import io

    from messenger.consume.lifecycle import JsonLinesHandler

    stream = io.StringIO()
    handler = JsonLinesHandler(stream)
    for level in (logging.INFO, logging.ERROR, logging.INFO):  # the second INFO: cached head
        handler.write_event(event, level, "messenger.consumer.events")
        record = logging.LogRecord("messenger.consumer.events", level, "", 0, event.name,
                                   None, None)
        record.event_fields = event.as_dict()
        record.created = event.at
        assert stream.getvalue() == JsonFormatter().format(record) + "\n"
        stream.seek(0)
        stream.truncate()


def test_held_info_lines_are_written_together_in_order_and_warnings_at_once():
    import io

    from messenger.consume.lifecycle import JsonLinesHandler, write_held_lines

    logger = logging.getLogger("test.held")
    logger.propagate, logger.level = False, logging.INFO
    stream = io.StringIO()
    handler = JsonLinesHandler(stream, hold_seconds=0.3)
    logger.handlers = [handler]
    try:
        # Given a handler holding INFO lines up to 0.3 s
        for n in range(3):
            log_event(LifecycleEvent("completed", "orders", f"m-{n}"), logger)
        # Then nothing is written yet, not even by a watchdog tick that is not due
        write_held_lines(within=0.05)
        assert stream.getvalue() == ""
        # When an ERROR event comes: the held lines go first, then it, in one go
        log_event(LifecycleEvent("failed", "orders", "m-3"), logger)
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert [(line["event"], line["message_id"]) for line in lines] == [
            ("completed", "m-0"), ("completed", "m-1"), ("completed", "m-2"), ("failed", "m-3")]
        # An INFO line is written by the tick that would be late otherwise
        log_event(LifecycleEvent("completed", "orders", "m-4"), logger)
        time.sleep(0.1)
        write_held_lines(within=0.25)
        assert stream.getvalue().count("\n") == 5
        # An ordinary record keeps the order: held lines first
        log_event(LifecycleEvent("completed", "orders", "m-5"), logger)
        logger.info("plain record")
        last = [json.loads(line) for line in stream.getvalue().splitlines()][-2:]
        assert last[0]["message_id"] == "m-5" and last[1]["message"] == "plain record"
        # flush() (logging.shutdown at exit) writes what is held
        log_event(LifecycleEvent("completed", "orders", "m-6"), logger)
        handler.flush()
        assert json.loads(stream.getvalue().splitlines()[-1])["message_id"] == "m-6"
        # A run that ends while its started line is held: only its end line (with the duration)
        # is written; a run still going when the lines go out keeps its started line
        stream.seek(0), stream.truncate()
        for name, message in (("started", "fast"), ("started", "slow"), ("completed", "fast")):
            log_event(LifecycleEvent(name, "orders", message, 0.01), logger)
        handler.flush()
        log_event(LifecycleEvent("completed", "orders", "slow", 2.0), logger)
        handler.flush()
        written = [(line["event"], line["message_id"])
                   for line in map(json.loads, stream.getvalue().splitlines())]
        assert written == [("started", "slow"), ("completed", "fast"), ("completed", "slow")]
        # An event that cannot be encoded is reported and left out; the lines around it are
        # written, and the handler keeps working
        stream.seek(0), stream.truncate()
        loop: list[Any] = []
        loop.append(loop)
        log_event(LifecycleEvent("completed", "orders", "before"), logger)
        log_event(LifecycleEvent("completed", "orders", "bad", fields={"loop": loop}), logger)
        log_event(LifecycleEvent("completed", "orders", "after"), logger)
        handler.flush()
        log_event(LifecycleEvent("completed", "orders", "later"), logger)
        handler.flush()
        assert [json.loads(line)["message_id"] for line in stream.getvalue().splitlines()] == [
            "before", "after", "later"]
        # and hold 0 writes each line at once, every started line included
        handler.hold_seconds = 0.0
        log_event(LifecycleEvent("started", "orders", "m-7"), logger)
        assert json.loads(stream.getvalue().splitlines()[-1])["event"] == "started"
        log_event(LifecycleEvent("completed", "orders", "m-7"), logger)
        assert json.loads(stream.getvalue().splitlines()[-1])["message_id"] == "m-7"
    finally:
        logger.handlers = []


@pytest.mark.parametrize("hold_seconds", [0.0, 0.05])
def test_every_write_holds_whole_lines_when_threads_log_at_once(hold_seconds):
    """A log pipeline (or a file another process appends to) sees a line whole only if it comes
    in one write: every write() the handler makes is whole JSON lines, whatever the threads."""
    from messenger.consume.lifecycle import JsonLinesHandler

    class Writes:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def write(self, text: str) -> None:
            self.calls.append(text)
            time.sleep(0)  # let another thread run between writes, as a real write does

        def flush(self) -> None:
            pass

    logger = logging.getLogger("test.whole_lines")
    logger.propagate, logger.level = False, logging.INFO
    stream = Writes()
    logger.handlers = [JsonLinesHandler(stream, hold_seconds=hold_seconds)]

    def log(thread: int) -> None:
        for n in range(200):
            log_event(LifecycleEvent("completed", "orders", f"m-{thread}-{n}"), logger)
            if n % 50 == 0:
                try:
                    raise ValueError(f"multi\nline {thread}")
                except ValueError:
                    logger.exception("with a traceback")
            if n % 70 == 0:
                log_event(LifecycleEvent("failed", "orders", f"f-{thread}-{n}"), logger)

    try:
        # Given eight threads logging events, records with tracebacks and warnings at once
        threads = [threading.Thread(target=log, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        logger.handlers[0].flush()
        # Then every write is one or more whole lines, each a JSON object
        assert stream.calls and all(call.endswith("\n") for call in stream.calls)
        lines = [json.loads(line) for call in stream.calls for line in call.splitlines()]
        assert sum(line.get("event") == "completed" for line in lines) == 8 * 200
        assert sum("exception" in line for line in lines) == 8 * 4
    finally:
        logger.handlers = []


def test_log_hold_is_checked_with_its_variable_and_range():
    from messenger.consume.settings import ConsumerSettings

    assert ConsumerSettings.from_env({"MESSENGER_LOG_HOLD_SECONDS": "0"}).log_hold == 0.0
    assert ConsumerSettings.from_env({}).log_hold == 0.25
    for bad in ("nan", "-1", "inf", "6"):
        with pytest.raises(InvalidSettings, match=r"MESSENGER_LOG_HOLD_SECONDS"):
            ConsumerSettings.from_env({"MESSENGER_LOG_HOLD_SECONDS": bad})
    with pytest.raises(InvalidSettings, match=r"from 0 to 5 seconds, got 6"):
        ConsumerSettings.from_env({"MESSENGER_LOG_HOLD_SECONDS": "6"})


def wait_for_length(items: list[Any], count: int, timeout: float) -> None:
    """Wait until another thread has put `count` items in `items` (or `timeout` passed)."""
    deadline = time.monotonic() + timeout
    while len(items) < count and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_poll_wakes_no_worker_only_while_its_messages_are_fast():
    from messenger.consume.runtime import HANDOFF_SECONDS, workers_to_wake

    # Not known yet (the first polls): a worker per chain, as for slow handlers
    assert workers_to_wake(None, 10) == 10 and workers_to_wake(None, 1) == 1
    # 10 chains at 50 µs each take 0.5 ms: the receiver runs them, no worker is woken
    assert workers_to_wake(0.00005, 10) == 0
    # and at 150 µs (such a message timed on a loaded machine, where other threads and
    # processes take turns): 1.5 ms
    assert workers_to_wake(0.00015, 10) == 0
    # at 1 ms each (a handler waiting on a network call) each chain gets a worker at once
    assert workers_to_wake(0.001, 10) == 10
    assert workers_to_wake(HANDOFF_SECONDS / 4, 4) == 0
    assert workers_to_wake(HANDOFF_SECONDS / 4, 5) == 5
    assert workers_to_wake(5.0, 1) == 1 and workers_to_wake(None, 0) == 0


def test_a_chain_that_waited_for_the_gil_does_not_make_the_messages_look_slow():
    from collections import deque

    from messenger.consume.runtime import (
        CHAIN_WINDOW,
        HANDOFF_SECONDS,
        typical_chain_seconds,
        workers_to_wake,
    )

    recent: deque[float] = deque(maxlen=CHAIN_WINDOW)
    assert typical_chain_seconds(recent) is None  # nothing run yet: workers take them
    recent.extend([0.0001] * CHAIN_WINDOW)
    # Given fast messages, a few of which waited 5 ms for the GIL or a core
    for _ in range(CHAIN_WINDOW // 2 - 1):
        recent.append(0.005)
        # Then the typical chain is still fast: the next poll wakes no worker
        assert typical_chain_seconds(recent) == 0.0001
        assert workers_to_wake(typical_chain_seconds(recent), 10) == 0
    # But once half the recent chains are slow (the handler now waits on something), each
    # chain of the next poll gets a worker
    recent.append(0.005)
    assert typical_chain_seconds(recent) == 0.005
    assert workers_to_wake(typical_chain_seconds(recent), 10) == 10
    # and fast again once most recent ones are
    recent.extend([0.0001] * (CHAIN_WINDOW // 2 + 1))
    assert typical_chain_seconds(recent) * 10 <= HANDOFF_SECONDS


def test_the_work_queue_wakes_as_many_workers_as_asked_and_the_rest_on_demand():
    import threading

    from messenger.consume.runtime import WorkQueue

    work = WorkQueue()
    taken: list[tuple[str, int]] = []
    lock = threading.Lock()
    release = threading.Event()

    def worker() -> None:
        while (chain := work.take()) is not None:
            with lock:
                taken.append((threading.current_thread().name, chain[0]))
            release.wait(5)  # every chain holds its worker until released

    threads = [threading.Thread(target=worker, name=f"w{n}") for n in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while work._idle < 4 and time.monotonic() < deadline:  # all four idle (waiting in take)
        time.sleep(0.005)
    # Given four chains put without waking anyone (the receiver runs them itself)
    work.put([[n] for n in range(4)], wake=0)
    time.sleep(0.1)
    # Then no worker took one, and the receiver's non-blocking take gets them in order
    assert taken == []
    assert work.take(block=False) == [0]
    # and wake_waiting (a rescue) gives each chain still waiting its own idle worker
    work.wake_waiting()
    wait_for_length(taken, 3, timeout=10)
    assert sorted(n for _, n in taken) == [1, 2, 3]
    assert len({name for name, _ in taken}) == 3, taken
    assert work.take(block=False) is None
    # Given two chains put waking two workers (slow work): the fourth idle worker takes one
    release.set()
    time.sleep(0.05)
    taken.clear()
    release.clear()
    work.put([[10], [11]], wake=2)
    wait_for_length(taken, 2, timeout=10)
    assert sorted(n for _, n in taken) == [10, 11] and len({name for name, _ in taken}) == 2
    # and close() lets every worker exit once the queue is empty
    release.set()
    work.close()
    for thread in threads:
        thread.join(2)
        assert not thread.is_alive()
    assert work.take() is None


def test_the_deleter_is_woken_once_per_batch_while_a_poll_runs_and_owes_no_wake():
    from messenger.consume.mailbox import DeleteBatcher

    sent: list[list[str]] = []

    class Recorded:
        def delete_batch(self, batch: list[Delivery]) -> list[Any]:
            sent.append([d.sqs_message_id for d in batch])
            return []

    def wait_for(count: int) -> None:
        wait_for_length(sent, count, timeout=5)
        assert len(sent) == count, sent

    counter = iter(range(1000))

    def added(count: int = 1) -> list[str]:
        ids = [f"m{next(counter)}" for _ in range(count)]
        for message_id in ids:
            batcher.add(Delivery({"ReceiptHandle": f"r-{message_id}", "MessageId": message_id},
                                 0.0, 30.0))
        return ids

    batcher = DeleteBatcher(Recorded(), linger=0.05, on_failure=lambda error: None)
    batcher.start()
    try:
        # A first entry while a poll runs does not wake the thread (it sleeps: nothing goes)...
        with batcher.deferred_wakes():
            first = added()
            time.sleep(0.3)
            assert sent == []
        # ...the end of the poll wakes it, and the linger counted from the add: sent at once
        wait_for(1)
        assert sent[0] == first
        # A full batch wakes it at once, within a poll too
        with batcher.deferred_wakes():
            full = added(10)
            wait_for(2)
            assert sent[1] == full
            # A deferral that lasts (a slow handler on the receiver): the watchdog's tick
            # gives the owed wake
            late = added()
            time.sleep(0.2)
            assert len(sent) == 2
            batcher.wake_if_due()
            wait_for(3)
            assert sent[2] == late
        # Outside a poll, a first entry wakes it as before: sent after the linger
        alone = added()
        wait_for(4)
        assert sent[3] == alone
    finally:
        batcher.close()
    assert len(sent) == 4


def test_the_deleter_sends_the_tail_of_a_drain_without_waiting_out_its_linger():
    from messenger.consume.mailbox import TRICKLE_DELETE_SECONDS, DeleteBatcher

    sent: list[list[str]] = []

    class Recorded:
        def delete_batch(self, batch: list[Delivery]) -> list[Any]:
            sent.append([d.sqs_message_id for d in batch])
            return []

    counter = iter(range(1000))

    def added(count: int) -> list[str]:
        ids = [f"m{next(counter)}" for _ in range(count)]
        for message_id in ids:
            batcher.add(Delivery({"ReceiptHandle": f"r-{message_id}", "MessageId": message_id},
                                 0.0, 30.0))
        return ids

    holds_nothing = [True]
    # An hour's linger: whatever goes out below went early, never at the end of its linger
    batcher = DeleteBatcher(Recorded(), linger=3600, on_failure=lambda error: None,
                            idle=lambda: holds_nothing[0])
    batcher.start()
    try:
        # The runtime holds nothing else and its last poll came back short: sent at once
        tail = added(3)
        batcher.went_idle(dry=True)
        wait_for_length(sent, 1, timeout=5)
        assert sent == [tail]
        # Nothing pending: going idle sends no empty batch
        batcher.went_idle(dry=True)
        # Idle after a full poll: sent after IDLE_DELETE_SECONDS if still nothing is held...
        last = added(2)
        batcher.went_idle(dry=False)
        wait_for_length(sent, 2, timeout=5)
        assert sent == [tail, last]
        # ...but not when the next poll's messages came in meanwhile (a backlog): the batch
        # keeps filling up (here until it is full)
        first = added(4)
        holds_nothing[0] = False
        batcher.went_idle(dry=False)
        time.sleep(0.3)
        assert len(sent) == 2
        rest = added(6)
        wait_for_length(sent, 3, timeout=5)
        assert sent[2] == first + rest
        # After a trickle (a poll brought some, fewer than asked), idle: the next message's
        # delete joins the batch within TRICKLE_DELETE_SECONDS of the first, then it goes out
        holds_nothing[0] = True
        trickle = added(1)
        batcher.went_idle(dry=False, trickle=True)
        time.sleep(TRICKLE_DELETE_SECONDS / 4)
        trickle += added(1)
        batcher.went_idle(dry=False, trickle=True)
        wait_for_length(sent, 4, timeout=5)
        assert sent[3] == trickle
    finally:
        batcher.close()
    assert len(sent) == 4


def test_health_file_follows_running_states_lazily_and_other_states_at_once(tmp_path):
    from messenger.consume.consumer import HEALTH_LAG_SECONDS
    from messenger.consume.health import HealthFile

    consumer = make(MobileEvents, health_file=str(tmp_path / "h.json"), health_grace=0.0)
    health = HealthFile(str(tmp_path / "h.json"))
    consumer.transition(ConsumerState.INITIALIZING)
    assert health.read().state == "INITIALIZING"  # at once
    consumer.transition(ConsumerState.LISTENING)
    assert health.read().state == "LISTENING"
    consumer.transition(ConsumerState.PROCESSING)
    entered = consumer._state_since
    consumer.flush_health()  # the last write is too recent: a flip twice per poll is not written
    assert health.read().state == "LISTENING"
    time.sleep(min(HEALTH_LAG_SECONDS, 60 / 4) + 0.05)
    consumer.flush_health()  # the watchdog's next tick: written, with the state's true start
    found = health.read()
    assert found.state == "PROCESSING" and found.since == entered
    consumer.transition(ConsumerState.EXITING)
    assert health.read().state == "EXITING"  # leaving the running states: at once


@pytest.mark.parametrize("cls,args", [
    (LifecycleEvent, ("completed", "orders", "m-1", 0.5, {"receive_count": 1}, 1700000000.0)),
    ("ReceivedMessage", ({"n": 1}, {"locale": "en"}, "a.b", "m-1", 2, 1.0, 2.0, "g", "s-1", "r")),
])
def test_events_and_received_messages_are_frozen_dataclasses_of_every_field(cls, args):
    """Both build their fields without the generated __init__ (they are made per message):
    still frozen dataclasses whose __init__ takes every field, in order."""
    import dataclasses
    import inspect

    from messenger.consume.mailbox import ReceivedMessage

    cls = ReceivedMessage if cls == "ReceivedMessage" else cls
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(inspect.signature(cls).parameters) == names
    made = cls(*args)
    assert [getattr(made, name) for name in names] == list(args)
    assert made == cls(*args) and dataclasses.replace(made) == made
    assert dataclasses.asdict(made) == dict(zip(names, args, strict=True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.message_id = "other"


def test_an_event_defaults_to_no_fields_and_now():
    before = time.time()
    event = LifecycleEvent("state", "orders", fields=None)
    assert event.fields == {} and event.message_id is None and event.duration is None
    assert before <= event.at <= time.time()
    assert LifecycleEvent("state", "orders").fields is not LifecycleEvent("s", "o").fields


def test_a_health_file_in_a_missing_directory_is_an_error_at_start(tmp_path):
    with pytest.raises(InvalidSettings, match="MESSENGER_HEALTH_FILE.*does not exist"):
        make(MobileEvents, health_file=str(tmp_path / "absent" / "h.json"))
    assert not (tmp_path / "absent").exists()


def test_two_consumer_classes_do_not_share_a_default_health_file():
    class Other(MobileEvents):
        pass

    first, second = make(MobileEvents).health.path, make(Other).health.path
    assert first != second
    assert first.endswith("test_consumer.MobileEvents.json") and "messenger-health-" in first


def test_the_health_file_is_rewritten_every_refresh_interval(tmp_path):
    from messenger.consume.health import HealthFile

    consumer = make(MobileEvents, health_file=str(tmp_path / "h.json"), health_refresh=0.1)
    health = HealthFile(str(tmp_path / "h.json"))
    consumer.transition(ConsumerState.INITIALIZING)
    first = health.read().written_at
    refresher = threading.Thread(target=consumer._refresh_health, daemon=True)
    refresher.start()
    deadline = time.monotonic() + 5
    while health.read().written_at == first and time.monotonic() < deadline:
        time.sleep(0.02)
    consumer._health_stop.set()
    refresher.join(5)
    record = health.read()
    assert record.written_at > first and record.state == "INITIALIZING"
    assert record.refresh_seconds == 0.1
