"""`messenger limits set|show CHANNEL`: a channel's flow-control limits changed at run time, without
a deploy (a view over `messenger.jobs.limits.LimitStore`; docs/flow-control.md).

    messenger limits show orders
    messenger limits set orders --rate 100/s --tenant-rate 5/s --max-concurrency 20
    messenger limits set orders --rate none          # no rate limit, whatever the declaration
    messenger limits set orders --clear rate         # back to the channel's declaration
    messenger limits show orders --json

Consumers follow a change within 5 s. A limit not set at run time is the channel's declaration
(`ChannelSpec(rate_limit=..., tenant_rate_limit=..., max_concurrency=...)`, read from its
queue's tags); a channel that declares none has no limit gate, so `set` refuses it. Who
changed it is `--as NAME`, default `<login> (cli)`, kept with the limits (`show` prints it). A
bad value is one line naming the option and the allowed values (exit 2).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from messenger.errors import InvalidSettings
from messenger.jobs.limits import LIMIT_FIELDS, UNLIMITED, LimitStore, LimitsView, check_limit
from messenger.operations.flow import channel_limits, require_declared
from messenger.operations.queues import channel_queues
from messenger.tools.controls import default_actor
from messenger.tools.runtime import CommandRuntime

#: Each limit's command-line option, by field (what `--clear` takes too, without the dashes).
OPTIONS = {"rate_limit": "rate", "tenant_rate_limit": "tenant-rate",
           "max_concurrency": "max-concurrency"}
#: What each limit means, for `show`.
MEANING = {
    "rate_limit": "jobs started per period, all consumers together",
    "tenant_rate_limit": "the same per tenant (fair-queue tenant key or FIFO group)",
    "max_concurrency": "handlers running at once, all consumers together",
}


def limit_changes(values: dict[str, Any], clear: list[str]) -> tuple[dict[str, str],
                                                                        tuple[str, ...]]:
    """The changes an operator asked for, checked: field → value as stored, and the fields to
    give back to the declaration. InvalidSettings naming the option for a bad value, an unknown
    `--clear` name, a limit both set and cleared, or nothing asked."""
    changes = {}
    for name, value in values.items():
        if value is None:
            continue
        try:
            changes[name] = check_limit(name, value)
        except InvalidSettings as error:
            raise InvalidSettings(f"--{OPTIONS[name]}: {error}") from None
    by_option = {option: name for name, option in OPTIONS.items()}
    cleared: list[str] = []
    for option in clear:
        field = by_option.get(option.removeprefix("--")) or (
            option if option in LIMIT_FIELDS else None)
        if field is None:
            raise InvalidSettings(f"--clear must name {', '.join(OPTIONS.values())}, got "
                                  f"{option!r}")
        if field in changes:
            raise InvalidSettings(f"--{OPTIONS[field]} is both set and cleared")
        cleared.append(field)
    if not changes and not cleared:
        raise InvalidSettings("limits set needs --rate, --tenant-rate, --max-concurrency or "
                              "--clear")
    return changes, tuple(dict.fromkeys(cleared))


def view_json(view: LimitsView) -> dict[str, Any]:
    """A channel's limits as JSON: each limit's value (None: no limit) and where it comes from,
    the last change, the consumers' current rate and jobs waiting."""
    limits = view.limits.as_text()
    declared = view.declared.as_text()
    return {
        "channel": view.channel,
        "limits": {name: {"value": limits[name], "source": view.source(name),
                          "declared": declared[name]} for name in LIMIT_FIELDS},
        "set_by": view.set_by or None,
        "set_at": view.set_at or None,
        "rate_per_second": round(view.report.rate, 3),
        "jobs_waiting": view.report.waiting,
        "processes_reporting": view.report.processes,
    }


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def view_lines(view: LimitsView) -> list[str]:
    """A channel's limits for the terminal: one line per limit (value, where it comes from),
    then the current rate and the jobs waiting."""
    limits = view.limits.as_text()
    declared = view.declared.as_text()
    lines = [f"{view.channel}: limits (a change takes effect within 5 s)"]
    for name in LIMIT_FIELDS:
        source = view.source(name)
        if source == "set":
            origin = "set at run time" + (
                f" (declared {declared[name]})" if declared[name] is not None else "")
        else:
            origin = source or "not declared"
        lines.append(f"  {name:<18} {limits[name] or UNLIMITED:<8} {origin:<28} "
                     f"{MEANING[name]}")
    if view.set_by:
        lines.append(f"  last change by {view.set_by} at {_when(view.set_at)}")
    report = view.report
    if report.processes:
        lines.append(f"  current rate       {report.rate:.1f} jobs/s ({report.processes} "
                     f"consumer process(es) reporting)")
        lines.append(f"  jobs waiting       {report.waiting} (held back by a limit)")
    else:
        lines.append("  current rate       - (no consumer reported in the last 30 s)")
    return lines


def run_cli(args: argparse.Namespace) -> int:
    changes: dict[str, str] = {}
    cleared: tuple[str, ...] = ()
    if args.limits_command == "set":  # checked before any AWS call
        changes, cleared = limit_changes(
            {"rate_limit": args.rate, "tenant_rate_limit": args.tenant_rate,
             "max_concurrency": args.max_concurrency}, args.clear)
    runtime = CommandRuntime.from_env()
    clients, settings = runtime.clients, runtime.settings
    # The channel from its queues' tags (a level's name gives its channel): a typo is
    # ChannelNotFound, never limits nobody reads
    channel = channel_queues(clients, settings, args.channel)[0].channel
    view = channel_limits(clients, settings, channel)
    assert view is not None  # its queues were just found
    if args.limits_command == "set":
        if changes:
            require_declared(view)
        store = LimitStore(clients, settings)
        store.ensure()
        store.set(channel, by=args.actor or default_actor(), clear=cleared, **changes)
        view = channel_limits(clients, settings, channel)
        assert view is not None
    if args.json:
        print(json.dumps(view_json(view), sort_keys=True))
    else:
        print("\n".join(view_lines(view)))
    return 0


def add_parser(commands: Any) -> None:
    limits = commands.add_parser(
        "limits", help="show or change a channel's rate and concurrency limits at run time")
    actions = limits.add_subparsers(dest="limits_command", required=True)
    show = actions.add_parser("show", help="a channel's limits, its current rate and the jobs "
                                           "waiting on a limit")
    show.add_argument("channel", help="the channel ('queue' or 'exchange.queue')")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(run=run_cli)
    change = actions.add_parser(
        "set", help="change a channel's limits (consumers follow within 5 s)",
        description="Each value 'none' sets that limit off whatever the channel declares; "
                    "--clear gives it back to the declaration.")
    change.add_argument("channel", help="the channel ('queue' or 'exchange.queue')")
    change.add_argument("--rate", default=None, metavar="N/s",
                        help="jobs started per period across every consumer: N/s, N/min, N/h, "
                             "or none")
    change.add_argument("--tenant-rate", default=None, metavar="N/s",
                        help="the same per tenant (fair-queue tenant key or FIFO group)")
    change.add_argument("--max-concurrency", default=None, metavar="N",
                        help="handlers running at once across every consumer: 1-10000, or none")
    change.add_argument("--clear", action="append", default=[], metavar="LIMIT",
                        help="give a limit back to the channel's declaration: rate, "
                             "tenant-rate or max-concurrency (repeatable)")
    change.add_argument("--as", dest="actor", default=None,
                        help="who acts (default: '<login> (cli)')")
    change.add_argument("--json", action="store_true", help="print the result as one JSON "
                                                            "object")
    change.set_defaults(run=run_cli)
