"""The `messenger` command (also `python -m messenger`).

Each subcommand lives in the module that implements it; this file only wires them up.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import Sequence

from botocore.exceptions import BotoCoreError, ClientError

from messenger.errors import InvalidSettings, MessengerError


def _local(args: argparse.Namespace) -> int:
    from messenger.tools.local import serve_forever

    return serve_forever(args.host, args.port, stock_moto=args.stock_moto)


def _api(args: argparse.Namespace) -> int:
    from messenger.api.app import JobApi
    from messenger.api.channels import channels_from_options
    from messenger.api.local import serve_forever
    from messenger.settings import Settings

    channels = channels_from_options(args.channel, args.status, args.channels)
    return serve_forever(JobApi(channels, Settings.from_env()), args.host, args.port)


def _requeue(args: argparse.Namespace) -> int:
    from messenger.tools.requeue import run_cli

    return run_cli(args)


def _status(args: argparse.Namespace) -> int:
    from messenger.jobs.status import StatusStore, render_timeline
    from messenger.operations.progress import describe_progress
    from messenger.tools.runtime import CommandRuntime

    runtime = CommandRuntime.from_env()
    records = StatusStore(runtime.clients, runtime.settings).timeline(args.message_id)
    # A channel whose consumers do not track: the last record is marked as last known.
    progress = describe_progress(runtime.clients, runtime.settings, records)
    print(render_timeline(args.message_id, records, progress))
    return 0 if records else 1


def _consume(args: argparse.Namespace) -> int:
    from messenger.consume.consumer import run_cli

    working_directory_on_import_path()
    top_package_findable(args.consumer)
    return run_cli(args)


def working_directory_on_import_path() -> None:
    """Put the working directory first on `sys.path`, as `python -m` does, unless it is there.

    `messenger consume pkg.mod:Class` then finds the user's own package from where it runs; the
    `messenger` console script alone would only see its own bin/ folder and the installed
    packages (`python -m messenger` already has it)."""
    cwd = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path):
        sys.path.insert(0, cwd)


def top_package_findable(target: str) -> None:
    """Raise InvalidSettings saying where it looked when the top package of 'pkg.mod:Class' is
    nowhere on the import path (the usual newcomer's case: run from the wrong folder)."""
    top = target.partition(":")[0].split(".")[0]
    if top.isidentifier() and importlib.util.find_spec(top) is None:
        raise InvalidSettings(
            f"consumer {target!r}: no module {top!r} in the working directory {os.getcwd()} or "
            f"the installed packages; run from the folder that holds {top!r}"
        )


def _emr(args: argparse.Namespace) -> int:
    from messenger.tools.emr import run_cli

    return run_cli(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="messenger", description="messenger platform tools")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="run the embedded AWS endpoint (moto) on loopback")
    local.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    local.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    local.add_argument(
        "--stock-moto",
        action="store_true",
        help="serve moto's own SQS, without messenger's index (per-request cost grows with depth)",
    )
    local.set_defaults(run=_local)

    api = commands.add_parser(
        "api", help="serve the HTTP job API on loopback (the Lambda's code, no authorization)")
    api.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    api.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one)")
    api.add_argument("--channel", action="append", default=[], metavar="NAME",
                     help="a single-queue channel to serve (repeatable)")
    api.add_argument("--status", action="store_true",
                     help="the --channel channels record status (GET /jobs/{id} reads it)")
    api.add_argument("--channels", default=None, metavar="FILE",
                     help="channels as JSON, the form of MESSENGER_API_CHANNELS (exchanges, "
                          "ordered, priorities)")
    api.set_defaults(run=_api)

    from messenger.tools.dashboard import add_parser as add_dashboard
    from messenger.tools.dlq import add_parser as add_dlq
    from messenger.tools.top import add_parser as add_top
    from messenger.tools.workers import add_parser as add_workers

    add_top(commands)
    add_workers(commands)
    add_dlq(commands)
    add_dashboard(commands)

    from messenger.tools.adopt import add_parser as add_adopt

    add_adopt(commands)

    from messenger.tools.schedules import add_parser as add_schedules

    add_schedules(commands)

    from messenger.tools.cost import add_parser as add_cost

    add_cost(commands)

    from messenger.tools.controls import add_parser as add_controls

    add_controls(commands)

    from messenger.tools.audit import add_parser as add_audit

    add_audit(commands)

    from messenger.tools.limits import add_parser as add_limits

    add_limits(commands)

    status = commands.add_parser("status", help="print a message's lifecycle timeline")
    status.add_argument("message_id", help="the id push() returned")
    status.set_defaults(run=_status)

    requeue = commands.add_parser("requeue", help="move messages from a DLQ back to a channel")
    requeue.add_argument("source_queue", help="physical name of the queue to drain (usually a DLQ)")
    requeue.add_argument(
        "destination_channel",
        help="queue to push to ('exchange.queue': that consumer's own queue), or with --type "
             "multi an exchange",
    )
    requeue.add_argument(
        "--type", dest="destination_type", choices=("single", "multi"), default="single",
        help="destination is a single-consumer queue or a multi-consumer exchange (default single)",
    )
    requeue.add_argument("--ordered", action="store_true", help="destination is ordered (FIFO)")
    requeue.add_argument("--max-messages", type=int, default=None, help="stop after this many")
    requeue.add_argument("--dry-run", action="store_true", help="report what would move")
    requeue.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                         help="wait up to SECONDS for messages in flight in the source (a killed "
                              "run's) to come back and move them too (default 0: report them)")
    requeue.add_argument("--visibility-timeout", type=int, default=60, metavar="SECONDS",
                         help="seconds a message being moved stays hidden in the source "
                              "(default 60)")
    requeue.set_defaults(run=_requeue)

    consume = commands.add_parser(
        "consume", help="run one consumer until SIGTERM (the container's PID 1)"
    )
    consume.add_argument("consumer", help="the Consumer subclass, 'package.module:ClassName'")
    consume.add_argument("--concurrency", type=int, default=None,
                         help="worker threads (default $MESSENGER_CONCURRENCY, the class's, or 1)")
    consume.add_argument("--shutdown-timeout", type=float, default=None,
                         help="seconds for in-flight work after SIGTERM (default 30)")
    consume.add_argument("--health-file", default=None,
                         help="health file, in a directory that exists (default "
                              "$MESSENGER_HEALTH_FILE, else one per consumer class in the "
                              "temporary directory)")
    consume.set_defaults(run=_consume)

    emr = commands.add_parser("emr", help="run PySpark jobs as EMR steps")
    emr_commands = emr.add_subparsers(dest="emr_command", required=True)
    submit = emr_commands.add_parser(
        "submit", help="upload a job with the messenger package and add it as an EMR step",
        description="Arguments after '--' go to the job.",
    )
    submit.add_argument("--cluster-id", required=True, help="EMR cluster id (j-...)")
    submit.add_argument("--code-bucket", default=None,
                        help="S3 bucket for the code (default $MESSENGER_CODE_BUCKET)")
    submit.add_argument("--name", default=None, help="step name (default 'messenger: <job>')")
    submit.add_argument("--action-on-failure", default="CONTINUE",
                        help="CONTINUE (default), CANCEL_AND_WAIT or TERMINATE_CLUSTER")
    submit.add_argument("--provisioning", default="verify",
                        help="the step's MESSENGER_PROVISIONING: verify (default, as the "
                             "pipeline) or auto")
    submit.add_argument("--python", default="/usr/bin/python3.11",
                        help="interpreter of the Spark driver and executors on the nodes "
                             "(default /usr/bin/python3.11)")
    submit.add_argument("script", help="the job script, e.g. spark_jobs/wishlist_price_drops.py")
    submit.add_argument("job_args", nargs=argparse.REMAINDER, help="-- then the job's arguments")
    submit.set_defaults(run=_emr)
    steps = emr_commands.add_parser("status", help="show the states of a cluster's steps")
    steps.add_argument("--cluster-id", required=True, help="EMR cluster id (j-...)")
    steps.add_argument("--step-id", default=None, help="only this step (s-...)")
    steps.set_defaults(run=_emr)
    runs = emr_commands.add_parser(
        "run", help="a publishing run's counts: partitions finished, rows published and skipped")
    runs.add_argument("run_key", help="the run key the job published with (publish(run_key=))")
    runs.add_argument("--json", action="store_true", help="print the counts as JSON")
    runs.set_defaults(run=_emr)
    return parser


#: Libraries whose INFO lines (e.g. botocore's "Found credentials in environment variables" on
#: every client) are noise to a command's user; shown with --verbose.
QUIET_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer")
#: Exit codes: 0 done, 1 the command's own "not done" (e.g. messages left), 2 a messenger error
#: (bad input, missing channel, budget exhausted), 3 AWS refused or could not be reached.
EXIT_MESSENGER_ERROR = 2
EXIT_AWS_ERROR = 3
#: Commands whose calls run on the library's settings, not `CommandRuntime`'s retry budget: those
#: that serve until stopped.
LIBRARY_BUDGET_COMMANDS = frozenset({"local", "api", "consume", "dashboard"})


#: Exit status of a command whose reader went away (`messenger status ... | head`): the one a
#: shell reports for a Unix tool that SIGPIPE ended (128 + 13), without a word on stderr.
EXIT_READER_GONE = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:  # a reader that went away shows here (also after --help), not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()


def reader_gone() -> int:
    """The command's output pipe was closed by its reader (`| head` has its lines): end
    quietly, as Unix tools do, with EXIT_READER_GONE. Standard output then points at
    /dev/null, so the interpreter's last flush of what is left writes nowhere instead of
    printing a BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_READER_GONE


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not args.verbose:
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        return int(args.run(args))
    except MessengerError as error:
        print(f"messenger: {error}", file=sys.stderr)
        return EXIT_MESSENGER_ERROR
    except (BotoCoreError, ClientError) as error:  # one line, not a botocore traceback
        from messenger.aws import RETRIED_EXCEPTIONS
        from messenger.tools.runtime import budget_note

        # an endpoint not reached: how long the command tried, and how to make it try longer
        note = f" ({budget_note()})" if isinstance(error, RETRIED_EXCEPTIONS) \
            and args.command not in LIBRARY_BUDGET_COMMANDS else ""
        print(f"messenger: AWS error: {error}{note}", file=sys.stderr)
        return EXIT_AWS_ERROR


if __name__ == "__main__":
    sys.exit(main())
