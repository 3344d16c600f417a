"""Run test files many times with every core kept busy: the check for timing-dependent tests.

A test that fails one clean-clone CI run in twenty is a defect as real as a slow one, and it
shows on a loaded machine first. This runs the given pytest arguments `--runs` times (default
20), each time in a fresh pytest process, while `--busy` processes (default: one per core) spin
on the CPU, and prints JSON: the runs, each failing test with how many runs it failed in, the
machine's load average, the wall time. Exit status 1 when any run failed.

    python -m tests.stress --runs 20 tests/integration/test_prefetch.py tests/unit/test_prefetch.py
    make test-timing RUNS=20            # the files named in the Makefile's TIMING_TESTS
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: A failing test as pytest's short summary names it.
FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def spin() -> None:
    """Keep one core busy until terminated."""
    while True:
        pass


def run_once(pytest_args: list[str], log: Path) -> tuple[int, list[str], float]:
    """One pytest process: its exit status, the tests that failed, its wall time."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *pytest_args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
    )
    log.write_text(result.stdout)
    return result.returncode, FAILED_LINE.findall(result.stdout), time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="how many runs (default 20)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1,
                        help="spinning processes beside the tests (default: one per core)")
    parser.add_argument("--logs", type=Path, default=Path("/tmp/messenger-stress"),
                        help="where each run's output goes (default /tmp/messenger-stress)")
    parser.add_argument("pytest_args", nargs="+", help="test files and pytest options")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if args.busy < 0:
        parser.error(f"--busy must be 0 or more, got {args.busy}")
    args.logs.mkdir(parents=True, exist_ok=True)
    # a SIGTERM (a stopped run) unwinds as an exit: the pytest run and the spinners end with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    failures: Counter[str] = Counter()
    runs = []
    started = time.monotonic()
    try:
        for number in range(1, args.runs + 1):
            log = args.logs / f"run-{number:02d}.txt"
            status, failed, seconds = run_once(args.pytest_args, log)
            failures.update(set(failed))
            runs.append({"run": number, "exit_status": status, "seconds": round(seconds, 1),
                         "failed": failed, "log": str(log),
                         "load_average": [round(x, 2) for x in os.getloadavg()]})
            print(f"stress: run {number}/{args.runs}: exit {status} in {seconds:.0f} s"
                  + (f", failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    finally:
        for spinner in spinners:
            spinner.terminate()
    failed_runs = sum(1 for run in runs if run["exit_status"] != 0)
    print(json.dumps({
        "pytest_args": args.pytest_args, "runs": args.runs, "busy_processes": args.busy,
        "cores": os.cpu_count(), "failed_runs": failed_runs,
        "failures": dict(failures.most_common()),
        "wall_seconds": round(time.monotonic() - started, 1), "each_run": runs,
    }, indent=2))
    return 1 if failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())
