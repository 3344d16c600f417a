"""`messenger audit`: the dashboard's audit trail, newest first (a view over
`messenger.operations.audit`; the dashboard's /audit page shows the same).

    messenger audit                          # the last 50 entries of the last 30 days
    messenger audit --channel orders --limit 200
    messenger audit --actor ada@example.com --days 7
    messenger audit --json                   # one JSON object per line

One line per entry: time (UTC), who (actor [sub], role), action, channel [targets], result:
detail. Read-only: nothing here (or anywhere in messenger) changes or removes an entry.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from messenger.errors import InvalidSettings
from messenger.operations.audit import DEFAULT_DAYS, RETENTION_DAYS, AuditTrail
from messenger.tools.runtime import CommandRuntime

DEFAULT_LIMIT = 50
MAX_LIMIT = 10_000


def run_cli(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= MAX_LIMIT:
        raise InvalidSettings(f"--limit must be 1 to {MAX_LIMIT}, got {args.limit}")
    if not 1 <= args.days <= RETENTION_DAYS:
        raise InvalidSettings(f"--days must be 1 to {RETENTION_DAYS}, got {args.days}")
    runtime = CommandRuntime.from_env()
    trail = AuditTrail(runtime.clients, runtime.settings)
    entries = trail.recent(limit=args.limit, days=args.days, channel=args.channel,
                           actor=args.actor)
    for entry in entries:
        print(json.dumps(asdict(entry), sort_keys=True) if args.json else entry.line())
    if not entries and not args.json:
        print(f"no audit entries in the last {args.days} day(s) in {trail.table}")
    return 0


def add_parser(commands: Any) -> None:
    audit = commands.add_parser(
        "audit", help="print the dashboard's audit trail: operator actions and refused "
                      "attempts, newest first")
    audit.add_argument("--channel", default=None, help="only entries naming this channel")
    audit.add_argument("--actor", default=None,
                       help="only entries of this person (name, e-mail or sub, exactly)")
    audit.add_argument("--days", type=int, default=DEFAULT_DAYS,
                       help=f"how many days back (1-{RETENTION_DAYS}, default {DEFAULT_DAYS})")
    audit.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                       help=f"at most this many entries (default {DEFAULT_LIMIT})")
    audit.add_argument("--json", action="store_true", help="one JSON object per line")
    audit.set_defaults(run=run_cli)
