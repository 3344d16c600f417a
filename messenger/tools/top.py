"""`messenger top`: a live view of the channels of a namespace (a view over
`messenger.operations.snapshot`).

    messenger top                 # refreshing table (Ctrl-C quits)
    messenger top --once          # one snapshot, for scripts and tests
    messenger top --json          # one snapshot as JSON
    messenger top --requeue orders [--yes]   # move a channel's DLQ back (asks first)

Per channel queue: visible, in flight, delayed, DLQ depth, age of the oldest message (with its
unit), messages/min in and out, consumer processes registered and alive (`messenger workers`),
and whether consumers received in the last 5 minutes ('-' when CloudWatch has no datapoint),
critical channels marked '!'. A priority level's row names its level ('jobs/high'); a paused
channel's row says '(paused)', and a line under the table names who paused it and when. Under it,
the channels that declare a flow-control limit (docs/flow-control.md): each limit ('*' when set
at run time, else declared), the jobs started per second and the jobs waiting on a limit, as
the consumers last reported them (`messenger limits show CHANNEL` for one in full). Fits an
80-column terminal; not on a terminal (a pipe, a file) the table has its own full width unless
COLUMNS is set: no name is folded or cut, each row is one line for `grep` and scripts.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from messenger.aws import ClientFactory
from messenger.errors import InvalidSettings
from messenger.jobs.limits import LIMIT_FIELDS, LimitsView
from messenger.operations.flow import namespace_limits
from messenger.operations.snapshot import ChannelRow, channel_dlq_rows, requeue_rows, snapshot
from messenger.settings import Settings
from messenger.tools.format import duration_text
from messenger.tools.runtime import CommandRuntime


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
    --json; 'oldest' is the age of the oldest message, 'work' the consumer
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
        label = f"{row.channel}/{row.level}" if row.level else row.channel
        name = f"[bold red]![/]{label}" if row.critical else label
        if row.paused:
            name += " [bold yellow](paused)[/]"
        table.add_row(
            name, _fmt(row.visible), _fmt(row.in_flight), _fmt(row.delayed),
            f"[{dlq_style}]{_fmt(row.dlq_depth)}[/]" if dlq_style else _fmt(row.dlq_depth),
            duration_text(row.oldest_age_seconds), _fmt(row.in_per_minute),
            _fmt(row.out_per_minute),
            _fmt(row.workers), _fmt(row.consumers_active),
        )
    table.caption = ("no platform-owned queues in this namespace" if not rows else
                     "! critical  work: consumer processes  recv: received in 5 min")
    paused = {row.channel: row.paused for row in rows if row.paused}
    if paused:
        table.caption += "".join(f"\n{channel}: {text}" for channel, text in paused.items())
    return table


def render_limits(views: list[LimitsView]) -> Any:
    """A rich Table of the channels with a limit: each limit (marked '*' when set at run time),
    jobs started per second and jobs waiting on a limit ('-': no consumer reported lately)."""
    from rich import box
    from rich.table import Table

    table = Table(title="flow control", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    table.add_column("channel", overflow="fold", min_width=10)
    for column in ("rate", "tenant", "conc", "now/s", "wait"):
        table.add_column(column, justify="right", no_wrap=True)
    for view in views:
        values = view.limits.as_text()
        limits = [(values[name] or "-") + ("*" if view.source(name) == "set" else "")
                  for name in LIMIT_FIELDS]
        report = view.report
        table.add_row(view.channel, *limits,
                      f"{report.rate:.1f}" if report.processes else "-",
                      str(report.waiting) if report.processes else "-")
    table.caption = "* set at run time (messenger limits)  now/s: jobs started  wait: held back"
    return table


def render_all(rows: list[ChannelRow], views: list[LimitsView], namespace: str) -> Any:
    """The channels' table and, when a channel has a limit, the flow-control table under it."""
    if not views:
        return render(rows, namespace)
    from rich.console import Group

    return Group(render(rows, namespace), render_limits(views))


def _view(clients: ClientFactory, settings: Settings) -> Any:
    return render_all(snapshot(clients, settings), namespace_limits(clients, settings),
                      settings.namespace)


#: Widest table printed when standard output is not a terminal (no name is that long).
MAX_PIPED_WIDTH = 10_000


def fit_width(console: Any, renderable: Any) -> Any:
    """`renderable`, with `console` (a rich Console) set to its width: on a terminal the
    terminal's (long names fold to fit it), and the one COLUMNS asks for when it is set (rich
    reads it); anywhere else the renderable's own full width, so that nothing is folded or cut
    (rich would fold at 80)."""
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        options = console.options.update_width(MAX_PIPED_WIDTH)
        console.width = max(1, console.measure(renderable, options=options).maximum)
    return renderable


def command_console() -> Any:
    """A rich Console whose reader going away (`messenger top --once | head`) ends the command
    as it ends every `messenger` command: the BrokenPipeError goes up to `cli.main`, which exits
    quietly with 141 (rich's own handler exits 1, the status of a command that did not do its
    work)."""
    from rich.console import Console

    class CommandConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more to write
            raise BrokenPipeError(errno.EPIPE, "standard output's reader went away")

    return CommandConsole()


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
    moves = ", ".join(f"{r.dlq_depth} from {r.dlq} to {r.queue_channel}" for r in rows)
    if not confirm(f"Requeue {moves}? [y/N] "):
        print("nothing moved")
        return 1
    reports = requeue_rows(clients, settings, rows)
    for report in reports:
        print(report.summary())
    return 0 if all(report.done for report in reports) else 1


def run_cli(args: argparse.Namespace) -> int:
    from rich.live import Live

    runtime = CommandRuntime.from_env()
    settings, clients = runtime.settings, runtime.clients
    console = command_console()
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
        console.print(fit_width(console, _view(clients, settings)))
        return 0
    with Live(fit_width(console, _view(clients, settings)), console=console,
              refresh_per_second=1) as live:
        try:
            while True:
                time.sleep(args.interval)
                live.update(fit_width(console, _view(clients, settings)))
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
