"""`messenger top`: a live view of the channels of a namespace.

    messenger top                 # refreshing table (Ctrl-C quits)
    messenger top --once          # one snapshot, for scripts and tests
    messenger top --json          # one snapshot as JSON
    messenger top --requeue orders [--yes]   # move a channel's DLQ back (asks first)

Per channel queue: visible, in flight, delayed, DLQ depth (from queue attributes), age of the oldest
message, messages/min in and out, consumer processes registered and alive (`messenger workers`),
and whether consumers received in the last 5 minutes (from CloudWatch, which the local endpoint
also publishes; '-' when CloudWatch has no datapoint), critical channels marked '!'. Fits an
80-column terminal.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from messenger.aws import ClientFactory
from messenger.channel import FIFO_SUFFIX
from messenger.errors import ChannelNotFound, InvalidSettings
from messenger.jobs.workers import list_workers
from messenger.ops.inventory import list_platform_resources
from messenger.ops.metrics import fetch_series, latest, sqs_metric, total
from messenger.settings import Settings

if TYPE_CHECKING:
    from messenger.tools.requeue import RequeueReport

#: Window of the rate and consumer columns.
WINDOW_MINUTES = 5


@dataclass(frozen=True)
class ChannelRow:
    """One line of the view."""

    channel: str
    queue: str
    visible: int
    in_flight: int
    delayed: int
    dlq: str | None
    dlq_depth: int | None
    oldest_age_seconds: float | None
    in_per_minute: float | None
    out_per_minute: float | None
    consumers_active: bool | None
    critical: bool
    #: Consumer processes registered for the channel and not lost (`messenger workers`).
    workers: int = 0


def snapshot(clients: ClientFactory, settings: Settings) -> list[ChannelRow]:
    """Collect the rows: one tag query, one GetQueueAttributes per queue, one GetMetricData,
    one Scan of the worker registry."""
    now = time.time()
    alive = [w.channel for w in list_workers(clients, settings) if not w.lost(now)]
    queues = list_platform_resources(clients, settings.namespace, roles=("queue",))
    sqs = clients.client("sqs")
    end = datetime.now(UTC)
    start = end - timedelta(minutes=WINDOW_MINUTES)
    requests = []
    for queue in queues:
        requests += [
            sqs_metric(queue.name, "ApproximateAgeOfOldestMessage", "Maximum"),
            sqs_metric(queue.name, "NumberOfMessagesSent", "Sum"),
            sqs_metric(queue.name, "NumberOfMessagesDeleted", "Sum"),
            sqs_metric(queue.name, "NumberOfMessagesReceived", "Sum"),
            sqs_metric(queue.name, "NumberOfEmptyReceives", "Sum"),
        ]
    series = fetch_series(clients.client("cloudwatch"), requests, start, end, 60) if queues else []
    rows = []
    for i, queue in enumerate(queues):
        age, sent, deleted, received, empty = series[i * 5 : i * 5 + 5]
        attributes = _attributes(sqs, queue.name)
        # The queue names its DLQ in its redrive policy (priority levels included).
        redrive = json.loads(attributes.get("RedrivePolicy") or "{}")
        dlq_name = str(redrive.get("deadLetterTargetArn", "")).rpartition(":")[2] or None
        dlq_depth = (
            _attributes(sqs, dlq_name).get("ApproximateNumberOfMessages") if dlq_name else None
        )
        receives = [v for v in (total(received), total(empty)) if v is not None]
        rows.append(
            ChannelRow(
                channel=queue.channel or queue.name,
                queue=queue.name,
                visible=int(attributes.get("ApproximateNumberOfMessages", 0)),
                in_flight=int(attributes.get("ApproximateNumberOfMessagesNotVisible", 0)),
                delayed=int(attributes.get("ApproximateNumberOfMessagesDelayed", 0)),
                dlq=dlq_name,
                dlq_depth=None if dlq_depth is None else int(dlq_depth),
                oldest_age_seconds=latest(age),
                in_per_minute=_rate(total(sent)),
                out_per_minute=_rate(total(deleted)),
                consumers_active=(sum(receives) > 0) if receives else None,
                critical=queue.channel_tags.critical,
                workers=sum(1 for channel in alive if _serves(channel, queue.channel or "")),
            )
        )
    # Critical first, then the deepest backlog.
    return sorted(rows, key=lambda r: (not r.critical, -(r.dlq_depth or 0) - r.visible, r.queue))


def _serves(worker_channel: str, row_channel: str) -> bool:
    """Whether a worker of `worker_channel` consumes the row's queue (a priority channel's
    consumer consumes every level's)."""
    return worker_channel == row_channel or _is_level_of(row_channel, worker_channel)


def _attributes(sqs: Any, name: str) -> dict[str, str]:
    try:
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        return dict(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"])
    except sqs.exceptions.QueueDoesNotExist:
        return {}


def _rate(count: float | None) -> float | None:
    return None if count is None else round(count / WINDOW_MINUTES, 1)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render(rows: list[ChannelRow], namespace: str) -> Any:
    """A rich Table of the rows, readable at 80 columns (the queue's physical name is in
    --json; 'oldest' is the age of the oldest message in seconds, 'work' the consumer
    processes alive, 'recv' whether any received in the last 5 minutes)."""
    from rich import box
    from rich.table import Table

    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    table = Table(title=f"messenger top: {namespace or '(no namespace)'} at {stamp} UTC",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    table.add_column("channel", overflow="fold", min_width=10)
    for column in ("ready", "flight", "delay", "DLQ", "oldest", "in/m", "out/m", "work",
                   "recv"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        dlq_style = "bold red" if row.dlq_depth else ""
        name = f"[bold red]![/]{row.channel}" if row.critical else row.channel
        table.add_row(
            name, _fmt(row.visible), _fmt(row.in_flight), _fmt(row.delayed),
            f"[{dlq_style}]{_fmt(row.dlq_depth)}[/]" if dlq_style else _fmt(row.dlq_depth),
            _fmt(row.oldest_age_seconds), _fmt(row.in_per_minute), _fmt(row.out_per_minute),
            _fmt(row.workers), _fmt(row.consumers_active),
        )
    table.caption = ("no platform-owned queues in this namespace" if not rows else
                     "! critical  work: consumer processes  recv: received in 5 min")
    return table


def requeue_channel(
    clients: ClientFactory,
    settings: Settings,
    channel: str,
    confirm: Callable[[str], bool],
) -> int:
    """Move a channel's DLQ back to its own queue (through the Requeuer) after
    `confirm(question)`; 0 when done, 1 when declined or not done.

    'exchange.queue' requeues to that consumer's queue only (the exchange's other consumers
    already did the work); a priority channel's logical name requeues every level's DLQ to
    that level's queue."""
    rows = channel_dlq_rows(clients, settings, channel)
    moves = ", ".join(f"{r.dlq_depth} from {r.dlq} to {r.channel}" for r in rows)
    if not confirm(f"Requeue {moves}? [y/N] "):
        print("nothing moved")
        return 1
    reports = requeue_rows(clients, settings, rows)
    for report in reports:
        print(report.summary())
    return 0 if all(report.done for report in reports) else 1


def channel_dlq_rows(clients: ClientFactory, settings: Settings, channel: str) -> list[ChannelRow]:
    """The rows of `channel` that have a DLQ (every level's for a priority channel's name);
    ChannelNotFound when there is none."""
    rows = [r for r in snapshot(clients, settings) if channel in (r.channel, r.queue)]
    if not rows:  # a priority channel: one queue and DLQ per level, 'jobs-high', 'jobs-low'
        rows = [r for r in snapshot(clients, settings) if _is_level_of(r.channel, channel)]
    rows = [r for r in rows if r.dlq is not None]
    if not rows:
        raise ChannelNotFound(f"no channel {channel!r} with a DLQ in namespace "
                              f"{settings.namespace or '(none)'!r}")
    return rows


def requeue_rows(clients: ClientFactory, settings: Settings,
                 rows: list[ChannelRow]) -> list[RequeueReport]:
    """Move each row's DLQ back to its queue (delete only after the queue accepted a message);
    one report per DLQ, as it really happened."""
    from messenger.tools.requeue import Requeuer, SubscriberTypes

    reports = []
    for row in rows:
        assert row.dlq is not None
        reports.append(Requeuer(
            source_queue=row.dlq,
            destination_channel=row.channel,
            destination_type=SubscriberTypes.SingleConsumer,
            ordered=row.queue.endswith(FIFO_SUFFIX),
            settings=settings,
            clients=clients,
        ).start())
    return reports


def _is_level_of(row_channel: str, channel: str) -> bool:
    """Whether `row_channel` is a priority level's queue of `channel` ('jobs-low' of 'jobs')."""
    return row_channel.startswith(f"{channel}-") and bool(
        re.fullmatch(r"[a-z0-9_]{1,16}", row_channel[len(channel) + 1 :])
    )


def run_cli(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    settings = Settings.from_env()
    clients = ClientFactory(settings.region)
    console = Console()
    if args.requeue:
        if not args.yes and not sys.stdin.isatty():
            raise InvalidSettings(f"top --requeue {args.requeue} needs --yes when there is no "
                                  f"terminal to ask")

        def confirm(question: str) -> bool:
            return bool(args.yes) or input(question).strip().lower() in ("y", "yes")

        return requeue_channel(clients, settings, args.requeue, confirm)
    if args.json:
        print(json.dumps([asdict(row) for row in snapshot(clients, settings)], indent=2))
        return 0
    if args.once:
        console.print(render(snapshot(clients, settings), settings.namespace))
        return 0
    with Live(render(snapshot(clients, settings), settings.namespace), console=console,
              refresh_per_second=1) as live:
        try:
            while True:
                time.sleep(args.interval)
                live.update(render(snapshot(clients, settings), settings.namespace))
        except KeyboardInterrupt:
            return 0


def add_parser(commands: Any) -> None:
    top = commands.add_parser("top", help="live view of the channels of the namespace")
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument("--json", action="store_true", help="print one snapshot as JSON")
    top.add_argument("--interval", type=float, default=5.0, help="seconds between refreshes")
    top.add_argument("--requeue", metavar="CHANNEL", help="requeue CHANNEL's DLQ (asks first)")
    top.add_argument("--yes", action="store_true", help="do not ask before requeueing")
    top.set_defaults(run=run_cli)
