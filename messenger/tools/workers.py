"""`messenger workers [CHANNEL]`: the consumer processes registered in the namespace.

    messenger workers               # every channel's workers
    messenger workers orders        # one channel's ('exchange.queue' for an exchange consumer)
    messenger workers --json

One line per worker (80 columns): channel, worker id, state (LOST when silent for 3 refresh
intervals), time since last seen, in flight, processed, failed. See
`messenger.jobs.workers` for what each consumer writes.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from messenger.jobs.workers import WorkerEntry, list_workers
from messenger.tools.format import duration_text
from messenger.tools.runtime import CommandRuntime


def render(entries: list[WorkerEntry], now: float | None = None) -> str:
    """The table `messenger workers` prints (at most 80 columns)."""
    now = time.time() if now is None else now
    if not entries:
        return "no workers registered"
    header = f"{'channel':<20} {'worker':<22} {'state':<10} {'seen':>5} {'busy':>4} " \
             f"{'done':>6} {'failed':>6}"
    lines = [header]
    for entry in entries:
        state = "LOST" if entry.lost(now) else entry.state
        lines.append(
            f"{entry.channel[:20]:<20} {entry.worker_id[-22:]:<22} {state[:10]:<10} "
            f"{duration_text(max(0.0, now - entry.last_seen)):>5} {entry.in_flight:>4} "
            f"{entry.processed:>6} {entry.failed:>6}"
        )
    lost = sum(1 for entry in entries if entry.lost(now))
    lines.append(f"{len(entries)} worker(s), {lost} lost" if lost else
                 f"{len(entries)} worker(s)")
    return "\n".join(lines)


def run_cli(args: argparse.Namespace) -> int:
    runtime = CommandRuntime.from_env()
    entries = list_workers(runtime.clients, runtime.settings, args.channel)
    if args.json:
        now = time.time()
        print(json.dumps([{**asdict(e), "lost": e.lost(now)} for e in entries], indent=2))
    else:
        print(render(entries))
    return 0


def add_parser(commands: Any) -> None:
    workers = commands.add_parser("workers", help="list the consumer processes (who is working)")
    workers.add_argument("channel", nargs="?", default=None,
                         help="only this channel's ('queue' or 'exchange.queue')")
    workers.add_argument("--json", action="store_true", help="print JSON")
    workers.set_defaults(run=run_cli)
