"""`messenger` commands in a pipeline, as real processes: a reader that goes away (`| head`)
ends a command quietly, as it ends a Unix tool, and `messenger top` not on a terminal prints
whole rows, names unfolded, whatever the width."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from messenger import ChannelSpec, Producer
from messenger.provision import Provisioner
from messenger.tools.cli import EXIT_READER_GONE

ROOT = Path(__file__).resolve().parents[2]
#: A channel name longer than an 80-column table leaves room for (its queue name, with the
#: namespace, '-dlq' and a level, stays within SQS's 80 characters).
LONG_CHANNEL = "nightly_price_drops_for_every_wishlist_of_the_shop_eu"


def _env(local_endpoint, settings) -> dict[str, str]:
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    env.pop("COLUMNS", None)
    return env


def _into_closed_pipe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `messenger ARGS` with standard output a pipe its reader closed before the command
    started: its first write (or flush) of output fails, as under `| head` once head is done."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run([sys.executable, "-m", "messenger", *args], cwd=ROOT, env=env,
                              stdout=writer, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(writer)


@pytest.fixture
def tracked_job(settings, clients) -> str:
    """A job of a tracked channel (its status timeline has a record), pushed and flushed."""
    class Tracked(Producer):
        channel = "orders"
        track_status = True

    producer = Tracked(settings=settings, clients=clients)
    job_id = str(producer.push({"n": 1}))
    producer.status.flush()
    return job_id


@pytest.mark.timeout(600)  # a hang: several commands, each a process of its own
def test_a_reader_that_goes_away_ends_every_command_quietly(settings, local_endpoint,
                                                            tracked_job):
    env = _env(local_endpoint, settings)
    for args in (["status", tracked_job], ["top", "--once"], ["top", "--json"], ["workers"],
                 ["dlq", "list", "orders"], ["--help"]):
        done = _into_closed_pipe(args, env)
        # Then no traceback, no BrokenPipeError, nothing at all on stderr; the exit status a
        # shell reports for a tool SIGPIPE ended (argparse's --help: its own quiet 0)
        assert done.stderr == "", (args, done.stderr)
        expected = 0 if args == ["--help"] else EXIT_READER_GONE
        assert done.returncode == expected, (args, done.returncode)


@pytest.mark.timeout(300)
def test_status_piped_into_head_prints_its_first_line_and_no_traceback(settings, local_endpoint,
                                                                       tracked_job):
    # Given `messenger status ID | head -n 1` in a shell
    env = _env(local_endpoint, settings)
    done = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -m messenger status {tracked_job} | head -n 1'],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    # Then head prints the timeline's first line, and the command nothing on stderr, whether
    # head was gone before it wrote or not
    assert done.returncode == 0 and tracked_job in done.stdout, done.stdout
    assert done.stdout.count("\n") == 1
    assert done.stderr == ""


@pytest.mark.timeout(300)
def test_top_not_on_a_terminal_prints_whole_rows(settings, clients, local_endpoint):
    # Given a prioritized channel whose rows ('name/high') are wider than 80 columns
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        LONG_CHANNEL, namespace=settings.namespace, priorities=("high", "low")))
    env = _env(local_endpoint, settings)  # no COLUMNS: a shell does not export it
    # When `messenger top --once` writes into a pipe
    done = subprocess.run([sys.executable, "-m", "messenger", "top", "--once"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # Then each level's row is one line holding the whole name and every column
    for level in ("high", "low"):
        rows = [line for line in done.stdout.splitlines() if f"{LONG_CHANNEL}/{level}" in line]
        assert len(rows) == 1, done.stdout
        # (ready, flight, delay, DLQ, oldest, in/m, out/m, work, recv: nothing in it)
        assert rows[0].split()[1:5] == ["0", "0", "0", "0"], rows
        assert len(rows[0].split()) == 10, rows
    assert max(len(line.rstrip()) for line in done.stdout.splitlines()) > 80
    # and a width asked for (COLUMNS=80, as tests/integration/test_top.py sets) is kept
    narrow = subprocess.run([sys.executable, "-m", "messenger", "top", "--once"], cwd=ROOT,
                            env={**env, "COLUMNS": "80"}, capture_output=True, text=True,
                            timeout=120)
    assert narrow.returncode == 0, narrow.stderr
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80
