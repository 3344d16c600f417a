"""`messenger schedules`: the one-time scheduled jobs of a channel, and cancelling one.

    messenger schedules list orders            # jobs waiting in Scheduler, soonest first
    messenger schedules list orders --json
    messenger schedules cancel 3f2a...         # delete its schedule before it fires
    messenger schedules cancel 3f2a... --as ada  # who cancelled it, on the job's timeline

`cancel` answers "cancelled" only when the job will not run: it takes the job's claim on each
consumer channel first, so a firing that races it is deleted unrun where it arrives
(`messenger.jobs.fired`, docs/guarantees.md). It exits 2 with one line when the id is unknown,
already fired or already cancelled (a fired schedule deletes itself:
`ActionAfterCompletion=DELETE`), and with "too late: scheduled job '<id>' fired at <T> UTC ...;
not cancelled" when a consumer took a firing of it first (also after its schedule is gone, when
`--channel` names the channel). Its calls retry within the command's budget
(`messenger.tools.runtime`). A view over `messenger.jobs.schedule_store`;
recurring schedules are the CDK app's (`stack.add_schedule`).
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from typing import Any

from messenger.jobs.schedule_store import ScheduledJob, ScheduleStore
from messenger.tools.controls import default_actor
from messenger.tools.format import due_text
from messenger.tools.runtime import CommandRuntime


def _when(due: datetime | None, now: datetime) -> str:
    if due is None:
        return "-"
    seconds = int((due - now).total_seconds())
    if seconds < 1:
        return due_text(seconds)
    for size, unit in ((86_400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"in {seconds // size}{unit}"
    return f"in {seconds}s"


def render(channel: str, jobs: list[ScheduledJob], now: datetime | None = None) -> str:
    """The table `messenger schedules list` prints (at most 80 columns)."""
    now = now or datetime.now(timezone.utc)
    if not jobs:
        return f"no scheduled jobs on {channel}"
    lines = [f"{'job id':<40} {'due (UTC)':<20} {'':>11} {'to':<6}"]
    for job in jobs:
        due = f"{job.due:%Y-%m-%d %H:%M:%S}" if job.due else "-"
        kind = "topic" if job.target.endswith(":publish") else "queue"
        lines.append(f"{job.job_id[:40]:<40} {due:<20} {_when(job.due, now):>11} {kind:<6}")
    lines.append(f"{len(jobs)} scheduled job(s) on {channel}")
    return "\n".join(lines)


def run_cli(args: argparse.Namespace) -> int:
    runtime = CommandRuntime.from_env()
    store = ScheduleStore(runtime.clients, runtime.settings)
    if args.schedules_command == "list":
        jobs = store.list(args.channel)
        if args.json:
            print(json.dumps([{"job_id": j.job_id, "due": j.due.isoformat() if j.due else None,
                               "schedule": j.name, "group": j.group, "target": j.target,
                               "destination": j.destination, "state": j.state} for j in jobs],
                             indent=2))
        else:
            print(render(args.channel, jobs))
        return 0
    actor = args.actor or default_actor()
    # ScheduleNotFound (TooLate among them: a firing was claimed first): exit 2
    job = store.cancel(args.job_id, args.channel, actor=actor)
    due = f" (was due {job.due:%Y-%m-%d %H:%M:%S} UTC)" if job.due else ""
    print(f"cancelled scheduled job {job.job_id}{due}, by {actor}")
    return 0


def add_parser(commands: Any) -> None:
    schedules = commands.add_parser("schedules", help="list or cancel scheduled jobs")
    actions = schedules.add_subparsers(dest="schedules_command", required=True)
    listing = actions.add_parser("list", help="a channel's scheduled jobs, soonest first")
    listing.add_argument("channel", help="the producer's channel ('queue' or 'exchange')")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(run=run_cli)
    cancel = actions.add_parser("cancel", help="cancel a scheduled job: it will not run "
                                "('too late', exit 2, when it fired first)")
    cancel.add_argument("job_id", help="the id push(at=...) returned")
    cancel.add_argument("--channel", default=None,
                        help="its channel: looked up directly instead of scanning the group")
    cancel.add_argument("--as", dest="actor", default=None,
                        help="who cancels it, on the job's timeline (default: '<login> (cli)')")
    cancel.set_defaults(run=run_cli)
