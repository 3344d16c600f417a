"""`messenger emr run <run key>`: a publishing run's ledger (messenger.jobs.runs) on the local
endpoint, as `messenger.spark.publish(run_key=...)` writes it, shown by the command."""

from __future__ import annotations

import json

import pytest

from messenger import Settings
from messenger.aws import ClientFactory
from messenger.errors import InvalidSettings
from messenger.jobs.runs import Fingerprint, RunLedger, job_id
from messenger.tools.cli import main


def fingerprint(run_key: str, keys: range) -> Fingerprint:
    found = Fingerprint()
    for key in keys:
        found.add(job_id(run_key, str(key)))
    return found


def test_a_runs_counts_and_unfinished_partitions_are_shown(
    settings: Settings, clients: ClientFactory, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    # Given a run of 3 partitions whose first attempt finished two of them and died in the third
    ledger = RunLedger(clients, settings, "drops-2026-11-21", "wishlist_events", 3)
    ledger.start()
    ledger.finish(0, fingerprint(ledger.run_key, range(0, 100)),
                  {"published": 100, "skipped": 0})
    ledger.finish(1, fingerprint(ledger.run_key, range(100, 190)),
                  {"published": 90, "skipped": 0})

    # Then the run shows 2 of 3 partitions finished, and exits 3 (not finished)
    assert main(["emr", "run", "drops-2026-11-21"]) == 3
    out = capsys.readouterr().out
    assert "partitions  2/3 finished" in out
    assert "published   190" in out and "skipped     0" in out
    assert "1 partition(s) not finished" in out

    # When the re-run finishes the third partition, 40 of whose rows the dead attempt had sent
    ledger.start()  # the same channel and partitions: accepted
    ledger.finish(2, fingerprint(ledger.run_key, range(190, 300)),
                  {"published": 70, "skipped": 40})
    ledger.attempt_done({"published": 70, "skipped": 230, "failed": 0})

    # Then all partitions are finished, with what each published and skipped
    assert main(["emr", "run", "drops-2026-11-21", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["finished_partitions"], shown["partitions"], shown["attempts"]) == (3, 3, 1)
    assert (shown["published"], shown["skipped"]) == (260, 40)
    assert shown["last_attempt"] == {"published": 70, "skipped": 230, "duplicates": 0,
                                     "failed": 0}
    finished = ledger.finished(2)
    assert finished is not None and finished.rows == 110


def test_a_run_key_is_one_channel_and_partitioning(
    settings: Settings, clients: ClientFactory, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    RunLedger(clients, settings, "r1", "orders", 4).start()
    with pytest.raises(InvalidSettings, match="'orders' in 4 partitions"):
        RunLedger(clients, settings, "r1", "orders", 8).start()
    with pytest.raises(InvalidSettings, match="'orders' in 4 partitions"):
        RunLedger(clients, settings, "r1", "audit", 4).start()
    # Unknown and invalid run keys
    assert main(["emr", "run", "r2"]) == 1
    assert "no run 'r2' recorded" in capsys.readouterr().out
    assert main(["emr", "run", "../x"]) == 2
    assert "run_key must be" in capsys.readouterr().err
