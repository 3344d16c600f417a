"""`messenger dlq list|show|requeue|delete CHANNEL ...`: the command-line view of the
dead-letter workbench (`messenger.operations.deadletters`).

    messenger dlq list orders --limit 50
    messenger dlq show orders order-42
    messenger dlq requeue orders order-42
    messenger dlq delete orders order-7 --yes

A letter is named by the id `dlq list` prints: its message id, or its SQS MessageId when several
letters carry that message id (naming such an id exits 2 with a line listing the MessageIds).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import asdict
from typing import Any

from messenger.errors import InvalidSettings
from messenger.jobs.status import StatusRecord
from messenger.operations.deadletters import DeadLetter, DeadLetterListing, DeadLetterWorkbench
from messenger.operations.requeue import MOVE_VISIBILITY_TIMEOUT
from messenger.tools.format import duration_text
from messenger.tools.runtime import CommandRuntime


def render_listing(listing: DeadLetterListing, width: int = 80) -> str:
    """Each letter within `width` columns: the id `messenger dlq show` takes (the message id,
    or the SQS MessageId when several letters carry that message id), age, attempts and reason
    (on lines of their own when too long), then the error (type and the traceback's last line,
    or the status table's last error), wrapped, never cut."""
    lines = textwrap.wrap(listing.summary(), width)
    shared = listing.shared_ids()
    for letter in listing.letters:
        attempts = "-" if letter.attempts is None else str(letter.attempts)
        # A message id carried by several letters names none of them: show the SQS MessageId,
        # which names this one. Ids are never cut: a longer one takes a line of its own.
        letter_id = letter.sqs_message_id if letter.id in shared else letter.id
        tail = f" {duration_text(letter.age_seconds()):>5} {attempts:>3}x "
        if len(letter_id) > 32:
            lines.append(letter_id)
            head = " " * 32 + tail
        else:
            head = f"{letter_id:<32}{tail}"
        if len(head) + len(letter.reason) <= width:
            lines.append(head + letter.reason)
        else:
            lines.append(head.rstrip())
            lines += textwrap.wrap(letter.reason, width, initial_indent="    ",
                                   subsequent_indent="    ")
        if letter.id in shared:
            lines += textwrap.wrap(f"message id {letter.id} (carried by several letters)", width,
                                   initial_indent="    ", subsequent_indent="    ")
        detail = letter.traceback_line or (f"last recorded error: {letter.last_error}"
                                           if letter.last_error else "")
        lines += textwrap.wrap(detail, width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def render_letter(letter: DeadLetter, body: Any, timeline: list[StatusRecord]) -> str:
    from messenger.jobs.status import render_timeline

    rows = [
        ("id", letter.id), ("sqs message id", letter.sqs_message_id), ("dlq", letter.dlq),
        ("reason", letter.reason), ("age", duration_text(letter.age_seconds())),
        ("attempts", "-" if letter.attempts is None else str(letter.attempts)),
        ("error", f"{letter.error_type}: {letter.error_message}" if letter.error_type else ""),
        ("last recorded error", letter.last_error), ("failed at", letter.failed_at),
        ("consumer", letter.consumer), ("routing key", letter.routing_key or ""),
        ("headers", json.dumps(letter.meta_headers) if letter.meta_headers else ""),
        ("message group", letter.group_id or ""),
        ("offloaded", "yes (body read from S3)" if letter.offloaded else ""),
    ]
    out = [f"{name + ':':<21}{value}" for name, value in rows if value]
    out.append("body:")
    out.append(json.dumps(body, indent=2, ensure_ascii=False) if not isinstance(body, str)
               else body)
    if letter.traceback:
        out += ["traceback:", letter.traceback.rstrip()]
    if timeline:
        out += ["status:", render_timeline(letter.id, timeline)]
    return "\n".join(out)


def _confirm(question: str, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise InvalidSettings(f"{question.strip()} needs --yes when there is no terminal to ask")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def run_cli(args: argparse.Namespace) -> int:
    """`messenger dlq list|show|requeue|delete CHANNEL ...`."""
    runtime = CommandRuntime.from_env()
    bench = DeadLetterWorkbench(args.channel, runtime.settings, runtime.clients,
                                visibility_timeout=args.visibility_timeout)
    if args.dlq_command == "list":
        listing = bench.list(limit=args.limit)
        if args.json:
            print(json.dumps({"dlqs": listing.dlqs, "not_seen": listing.not_seen,
                              "fifo_blocked": listing.fifo_blocked,
                              "stopped_at_limit": listing.stopped_at_limit,
                              "letters": [letter.as_dict() for letter in listing.letters]},
                             indent=2))
        else:
            print(render_listing(listing))
        return 0
    if args.dlq_command == "show":
        letter, body, timeline = bench.show(args.id)
        if args.json:
            print(json.dumps({**letter.as_dict(), "body": body,
                              "status": [asdict(r) for r in timeline]}, indent=2, default=str))
        else:
            print(render_letter(letter, body, timeline))
        return 0
    ids = list(dict.fromkeys(args.ids))
    if args.dlq_command == "requeue":
        reports = bench.requeue(ids)
        for report in reports:
            print(report.summary())
        return 0 if all(report.failed == 0 for report in reports) else 1
    if not _confirm(f"Delete {len(ids)} dead letter(s) from {', '.join(bench.dlqs)}?", args.yes):
        print("nothing deleted")
        return 1
    deleted = bench.delete(ids)
    if deleted < len(ids):  # SQS refused some (logged): they are still in the DLQ
        print(f"deleted {deleted} of {len(ids)} message(s) from {', '.join(bench.dlqs)}; "
              f"{len(ids) - deleted} refused by SQS, still in the DLQ (see the log)")
        return 1
    print(f"deleted {deleted} message(s) from {', '.join(bench.dlqs)}")
    return 0


def add_parser(commands: Any) -> None:
    dlq = commands.add_parser("dlq", help="list, show, requeue or delete single dead letters")
    actions = dlq.add_subparsers(dest="dlq_command", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("channel", help="'queue', 'exchange.queue' or a prioritized "
                                            "channel (every level's DLQ)")
        parser.add_argument("--visibility-timeout", type=int, default=MOVE_VISIBILITY_TIMEOUT,
                            metavar="SECONDS", help="seconds what a scan reads stays hidden "
                            "if the scan dies (default 60; released at its end)")
        parser.set_defaults(run=run_cli)

    listing = actions.add_parser("list", help="list the dead letters of a channel")
    common(listing)
    listing.add_argument("--limit", type=int, default=None, help="at most this many")
    listing.add_argument("--json", action="store_true", help="print JSON")
    show = actions.add_parser("show", help="one dead letter: body, headers, traceback, status")
    common(show)
    show.add_argument("id", help="the id `dlq list` shows (a message id, or an SQS MessageId)")
    show.add_argument("--json", action="store_true", help="print JSON")
    requeue = actions.add_parser("requeue", help="move these dead letters back to their queue")
    common(requeue)
    requeue.add_argument("ids", nargs="+", metavar="ID")
    delete = actions.add_parser("delete", help="delete these dead letters (asks first)")
    common(delete)
    delete.add_argument("ids", nargs="+", metavar="ID")
    delete.add_argument("--yes", action="store_true", help="do not ask")
