"""`messenger requeue SOURCE DESTINATION`: the command-line view of
`messenger.operations.requeue`."""

from __future__ import annotations

import argparse

from messenger.operations.requeue import Requeuer, SubscriberTypes
from messenger.tools.runtime import CommandRuntime


def run_cli(args: argparse.Namespace) -> int:
    """`messenger requeue SOURCE DESTINATION [--type multi] [--max-messages N] [--dry-run]`."""
    from rich.progress import Progress

    runtime = CommandRuntime.from_env()
    with Progress(transient=True) as bar:
        task = bar.add_task(
            f"requeue {args.source_queue} -> {args.destination_channel}", total=None
        )
        requeuer = Requeuer(
            source_queue=args.source_queue,
            destination_channel=args.destination_channel,
            destination_type=SubscriberTypes(args.destination_type),
            ordered=True if args.ordered else None,
            max_messages=args.max_messages,
            dry_run=args.dry_run,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
            wait_seconds=args.wait,
            visibility_timeout=args.visibility_timeout,
            settings=runtime.settings,
            clients=runtime.clients,
        )
        report = requeuer.start()
    print(report.summary())
    for key, count in sorted(report.routing_keys.items()):
        print(f"  {key}: {count}")
    # 1: not done (failures, or messages still in flight in the source): run again.
    return 0 if report.done else 1
