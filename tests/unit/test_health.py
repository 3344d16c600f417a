"""The health file and `check_consumer_health`: stuck states fail for real, others pass; a check
that cannot tell (no file, writer gone or hung, nowhere to write) never says healthy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from messenger.consume.health import HealthFile, HealthRecord, health_clock, main

NOW = 1_000_000.0


def write(path: Path, state: str, age: float, timeout: float | None, now: float = NOW,
          pid: int | None = None, written_ago: float = 0.0, refresh: float = 5.0
          ) -> HealthFile:
    """A record by this process (alive), written `written_ago` s before `now`."""
    health = HealthFile(str(path))
    health.write(HealthRecord(state, now - age, timeout, pid or os.getpid(), "app.Consumer",
                              now - written_ago, refresh))
    return health


@pytest.mark.parametrize("state", ["INITIALIZING", "INITIALIZED", "PROCESSING", "EXITING"])
def test_a_limited_state_past_its_limit_is_unhealthy(tmp_path, state):
    health = write(tmp_path / "h.json", state, age=91, timeout=90)
    verdict = health.check(now=NOW)
    assert not verdict.healthy
    assert f"stuck in {state} for 91.0 s (limit 90 s)" in verdict.reason
    assert write(tmp_path / "h.json", state, age=89, timeout=90).check(now=NOW).healthy


@pytest.mark.parametrize("state", ["LISTENING", "IDLE", "EXITED"])
def test_waiting_states_have_no_limit(tmp_path, state):
    assert write(tmp_path / "h.json", state, age=86_400, timeout=None).check(now=NOW).healthy


def test_missing_file_is_unhealthy(tmp_path):
    # No file: not started yet, or it cannot write there (the ECS start period covers a start)
    verdict = HealthFile(str(tmp_path / "absent.json")).check(now=NOW)
    assert not verdict.healthy and "has not written one" in verdict.reason


def test_a_file_not_refreshed_for_three_intervals_is_unhealthy(tmp_path):
    # Given an IDLE consumer (no limit of its own) that promised a rewrite every 5 s
    path = tmp_path / "h.json"
    assert write(path, "IDLE", age=600, timeout=None, written_ago=14.9).check(now=NOW).healthy
    # When it has not rewritten it for 15 s (hung, up after EXITED, or its writes fail)
    verdict = write(path, "IDLE", age=600, timeout=None, written_ago=15.1).check(now=NOW)
    # Then the check fails and says so
    assert not verdict.healthy
    assert "has not refreshed" in verdict.reason and "every 5 s expected" in verdict.reason


def test_a_writer_that_is_gone_is_unhealthy(tmp_path):
    # Given the last record of a process that has ended (os._exit, kill -9)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    verdict = write(tmp_path / "h.json", "LISTENING", age=1, timeout=None,
                    pid=gone.pid).check(now=NOW)
    assert not verdict.healthy
    assert f"(pid {gone.pid}) is not running" in verdict.reason


def test_a_zombie_writer_is_unhealthy(tmp_path):
    # Given a child that exited and was not reaped: kill(pid, 0) still finds it
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while not Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] \
                == "Z":
            time.sleep(0.01)
        verdict = write(tmp_path / "h.json", "IDLE", age=1, timeout=None,
                        pid=zombie.pid).check(now=NOW)
        assert not verdict.healthy and "is not running" in verdict.reason
    finally:
        zombie.wait()


def test_a_directory_the_check_cannot_write_in_is_unhealthy(tmp_path, monkeypatch):
    # Given a fresh record, and a directory where a write now fails (full disk, read-only)
    health = write(tmp_path / "h.json", "IDLE", age=1, timeout=None)
    assert health.check(now=NOW).healthy
    import tempfile as tempfile_module

    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile_module, "mkstemp", full)
    verdict = health.check(now=NOW)
    assert not verdict.healthy
    assert "cannot write its health file" in verdict.reason and "No space left" in verdict.reason


def test_a_wall_clock_step_does_not_change_the_verdict(tmp_path, monkeypatch):
    # Given an idle consumer's file written on the boot clock
    path = tmp_path / "h.json"
    now = health_clock()
    write(path, "IDLE", age=30, timeout=None, now=now)
    write(tmp_path / "p.json", "PROCESSING", age=10, timeout=90, now=now)
    # When the wall clock steps back an hour (and forward a day)
    for step in (-3600.0, 86_400.0):
        wall = time.time() + step
        monkeypatch.setattr(time, "time", lambda wall=wall: wall)
        # Then the check reads the same
        assert HealthFile(str(path)).check().healthy
        assert HealthFile(str(tmp_path / "p.json")).check().healthy


def test_the_clock_is_the_hosts_boot_clock():
    # Every process of the host reads the same clock: a child's reading falls between ours
    before = health_clock()
    child = subprocess.run(
        [sys.executable, "-c", "from messenger.consume.health import health_clock as c; "
                               "print(c())"], capture_output=True, text=True, check=True)
    after = health_clock()
    assert before <= float(child.stdout) <= after


def test_a_missing_directory_is_an_error_not_created(tmp_path):
    health = HealthFile(str(tmp_path / "absent" / "h.json"))
    with pytest.raises(FileNotFoundError):
        write(tmp_path / "absent" / "h.json", "IDLE", age=0, timeout=None)
    assert not (tmp_path / "absent").exists()
    assert not health.check(now=NOW).healthy


@pytest.mark.parametrize("content", [
    "not json", "{}", '{"state": "PROCESSING", "since": "x"}',
    # Values that compare false with every limit, or never run out, must not read as healthy.
    '{"state": "PROCESSING", "since": 999000, "timeout_seconds": NaN}',
    '{"state": "PROCESSING", "since": 999000, "timeout_seconds": null}',
    '{"state": "PROCESSING", "since": NaN, "timeout_seconds": 90}',
    '{"state": "PROCESSING", "since": Infinity, "timeout_seconds": 90}',
    '{"state": "processing", "since": 999000, "timeout_seconds": 90}',
    '{"state": "STUCK", "since": 999000, "timeout_seconds": 90}',
    '{"state": "EXITING", "since": 999000, "timeout_seconds": true}',
])
def test_a_malformed_file_is_unhealthy(tmp_path, content):
    path = tmp_path / "h.json"
    path.write_text(content)
    verdict = HealthFile(str(path)).check(now=NOW)
    assert not verdict.healthy
    assert f"health file {path} is malformed" in verdict.reason  # the check's output names it


def test_a_since_in_the_future_is_unhealthy(tmp_path):
    # Given a record whose clock would only start an hour from now
    health = write(tmp_path / "h.json", "PROCESSING", age=-3600, timeout=90, written_ago=-3600)
    # Then it is not read as "within its limit"
    verdict = health.check(now=NOW)
    assert not verdict.healthy and "ahead" in verdict.reason
    # A small clock step is tolerated
    assert write(tmp_path / "h.json", "PROCESSING", age=-1, timeout=90).check(now=NOW).healthy


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    health = write(tmp_path / "h.json", "PROCESSING", age=0, timeout=90)
    record = health.read()
    assert record == HealthRecord("PROCESSING", NOW, 90.0, os.getpid(), "app.Consumer", NOW, 5.0)
    assert json.loads((tmp_path / "h.json").read_text())["pid"] == os.getpid()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.json", "h.json.lock"]


def test_main_exit_codes(tmp_path, capsys):
    path = tmp_path / "h.json"
    write(path, "PROCESSING", age=1000, timeout=90, now=health_clock())  # stuck
    assert main(["--file", str(path)]) == 1
    assert capsys.readouterr().out.startswith("unhealthy: app.Consumer stuck in PROCESSING")
    write(path, "IDLE", age=1000, timeout=None, now=health_clock())
    assert main(["--file", str(path)]) == 0
    assert main(["--file", str(tmp_path / "missing.json")]) == 1


def test_without_a_file_the_check_reads_every_consumers_default_file(tmp_path, monkeypatch,
                                                                      capsys):
    import tempfile as tempfile_module

    from messenger.consume.health import default_health_file

    monkeypatch.delenv("MESSENGER_HEALTH_FILE", raising=False)
    monkeypatch.setattr(tempfile_module, "tempdir", str(tmp_path))
    assert main([]) == 1  # none at all: cannot tell
    # Two consumers on one host: two files, the check fails when either is unhealthy
    first, second = default_health_file("app.Orders"), default_health_file("app.Audit")
    assert first != second
    write(Path(first), "IDLE", age=1, timeout=None, now=health_clock())
    write(Path(second), "IDLE", age=1, timeout=None, now=health_clock())
    assert main([]) == 0
    write(Path(second), "PROCESSING", age=1000, timeout=90, now=health_clock())
    assert main([]) == 1
    assert "stuck in PROCESSING" in capsys.readouterr().out


def test_console_script_reads_the_file_named_by_the_environment(tmp_path):
    # The HEALTHCHECK runs `check_consumer_health` with no arguments.
    script = shutil.which("check_consumer_health", path=os.path.dirname(sys.executable))
    command = [script] if script else [sys.executable, "-m", "messenger.consume.health"]
    path = tmp_path / "h.json"
    write(path, "EXITING", age=1000, timeout=45, now=health_clock())
    env = {**os.environ, "MESSENGER_HEALTH_FILE": str(path)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "stuck in EXITING" in result.stdout


def test_without_a_file_the_files_of_consumers_that_ended_are_listed_not_counted(
        tmp_path, monkeypatch, capsys):
    import tempfile as tempfile_module

    from messenger.consume.health import default_health_file, process_started

    monkeypatch.delenv("MESSENGER_HEALTH_FILE", raising=False)
    monkeypatch.setattr(tempfile_module, "tempdir", str(tmp_path))
    # Given the files an earlier run and the tests left: a consumer that exited cleanly, one
    # that was killed, and one whose pid a later process reuses (this one, started after it)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    now = health_clock()
    write(Path(default_health_file("app.Clean")), "EXITED", age=5, timeout=None, now=now,
          pid=ended.pid, written_ago=5)
    write(Path(default_health_file("app.Killed")), "PROCESSING", age=9, timeout=90, now=now,
          pid=ended.pid, written_ago=9)
    started = process_started(os.getpid())
    assert started is not None and started <= now
    write(Path(default_health_file("app.Reused")), "IDLE", age=60, timeout=None,
          now=started - 2, written_ago=0)
    # Then with no consumer running the check fails, saying why, and names each file it skipped
    assert main([]) == 1
    out = capsys.readouterr().out
    assert f"app.Clean.json: app.Consumer (pid {ended.pid}) exited cleanly" in out
    assert (f"app.Killed.json: app.Consumer (pid {ended.pid}) is not running (it last wrote "
            f"PROCESSING)") in out
    assert f"app.Reused.json: app.Consumer (pid {os.getpid()}) is not running" in out
    assert out.count("not counted: ") == 3
    assert out.rstrip().splitlines()[-1].startswith("unhealthy: no running consumer's health")
    # When a consumer runs beside them, healthy: the check passes, and still lists the others
    write(Path(default_health_file("app.Orders")), "IDLE", age=1, timeout=None,
          now=health_clock())
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.count("not counted: ") == 3
    assert "healthy: app.Consumer IDLE" in out and "unhealthy" not in out
    # and a running consumer that is unhealthy still fails it
    write(Path(default_health_file("app.Orders")), "PROCESSING", age=1000, timeout=90,
          now=health_clock())
    assert main([]) == 1
    assert "unhealthy: app.Consumer stuck in PROCESSING" in capsys.readouterr().out


def test_a_named_file_whose_pid_another_process_reuses_is_not_running(tmp_path):
    # Given the record of a consumer written before this process (same pid) started
    from messenger.consume.health import process_started

    started = process_started(os.getpid())
    assert started is not None
    health = write(tmp_path / "h.json", "IDLE", age=1, timeout=None, now=started - 2)
    # Then the check does not take this process for its writer
    verdict = health.check(now=started + 1)
    assert not verdict.healthy and f"(pid {os.getpid()}) is not running" in verdict.reason
