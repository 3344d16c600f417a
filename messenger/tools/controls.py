"""`messenger pause|resume CHANNEL` and `messenger cancel CHANNEL JOB_ID`: an operator's controls
of running consumers (views over `messenger.operations.pause` and `messenger.jobs.controls`).

    messenger pause orders            # its consumers stop receiving (Fargate: at their next
                                      # heartbeat; Lambda: its event source mappings disabled)
    messenger resume orders
    messenger cancel orders order-42  # the consumer running it stops it at its next heartbeat:
                                      # dead-lettered, 'cancelled by <who>'

Who acted is `--as NAME`, default `<login> (cli)`; it is recorded on the queue's tag (pause) or
on the job's timeline and dead-letter reason (cancel).
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from messenger.errors import ChannelNotFound
from messenger.jobs.controls import CancelRequests
from messenger.operations.pause import pause, resume
from messenger.tools.runtime import CommandRuntime


def default_actor() -> str:
    try:
        return f"{getpass.getuser()} (cli)"
    except Exception:  # no login name (a container without one)
        return "cli"


def run_pause(args: argparse.Namespace) -> int:
    runtime = CommandRuntime.from_env()
    act = pause if args.command == "pause" else resume
    try:
        report = act(runtime.clients, runtime.settings, args.channel,
                     actor=args.actor or default_actor())
    except ChannelNotFound as error:
        print(f"messenger: {error}")
        return 2
    print(report.summary())
    return 0 if report.ok else 1


def run_cancel(args: argparse.Namespace) -> int:
    runtime = CommandRuntime.from_env()
    requests = CancelRequests(runtime.clients, runtime.settings, args.channel)
    made = requests.request(args.job_id, args.actor or default_actor())
    print(f"{args.channel}: cancel of {made.message_id} requested by {made.by}; the consumer "
          f"running it stops it at its next heartbeat (the request expires in an hour)")
    return 0


def add_parser(commands: Any) -> None:
    for name, text in (("pause", "pause a channel's consumers (Fargate and Lambda)"),
                       ("resume", "resume a paused channel's consumers")):
        command = commands.add_parser(name, help=text)
        command.add_argument("channel", help="the channel ('queue', 'exchange.queue' or a "
                                             "prioritized channel's name)")
        command.add_argument("--as", dest="actor", default=None,
                             help="who acts (default: '<login> (cli)')")
        command.set_defaults(run=run_pause, command=name)
    cancel = commands.add_parser("cancel", help="stop a running job at its next heartbeat")
    cancel.add_argument("channel", help="the channel its consumer reads")
    cancel.add_argument("job_id", help="the job's message id (what push() returned)")
    cancel.add_argument("--as", dest="actor", default=None,
                        help="who acts (default: '<login> (cli)')")
    cancel.set_defaults(run=run_cancel)
