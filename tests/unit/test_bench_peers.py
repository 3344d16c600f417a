"""bench/peers.py's arithmetic: the spread of the round ratios, and the check that no drain's
requests leaked into another's window (from the endpoint's recording)."""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _peers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "bench" / "peers.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


peers = _peers()


def test_the_spread_gives_the_median_its_quartiles_and_an_interval_without_the_extremes():
    # Given 12 round ratios, two of them outliers on each side
    rounds = [0.64, 0.7, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 1.0, 1.4, 1.52]
    found = peers.spread(rounds)
    assert found["median"] == 0.955 and (found["min"], found["max"]) == (0.64, 1.52)
    assert found["q1"] < found["median"] < found["q3"]
    assert found["iqr"] == round(found["q3"] - found["q1"], 3)
    # Then the median's interval runs from the 3rd lowest to the 3rd highest round, at 96%
    assert found["median_ci"] == [0.9, 1.0] and found["median_ci_confidence"] == 0.961
    assert found["rounds"] == rounds
    # 9 rounds: the 2nd lowest to the 2nd highest; 5 rounds: no interval is 95% sure
    assert peers.spread(rounds[:9])["median_ci"] == [0.7, 0.97]
    assert "median_ci" not in peers.spread(rounds[:5])


def _record(path: Path, requests: list[tuple[str | None, str, str]]) -> None:
    """A recording as moto's recorder writes it: (app id, action, queue URL) per request."""
    with path.open("w") as out:
        for app, action, queue in requests:
            agent = "Boto3/1 Python/3.11" + (f" app/{app}" if app else "") + " Botocore/1"
            body = base64.b64encode(json.dumps({"QueueUrl": queue}).encode()).decode()
            out.write(json.dumps({"headers": {"User-Agent": agent,
                                              "X-Amz-Target": f"AmazonSQS.{action}"},
                                  "method": "POST", "url": "/", "body": body,
                                  "body_encoded": True}) + "\n")


def _drains(*apps: tuple[str, str, int]) -> list[tuple[str, str, dict]]:
    return [(app, queue, {"requests": receives, "by_operation": {"sqs.ReceiveMessage": receives}})
            for app, queue, receives in apps]


def test_isolation_holds_when_each_child_kept_to_its_window_and_queue(tmp_path):
    recording = tmp_path / "rec.jsonl"
    _record(recording, [(None, "SendMessageBatch", "q0"), ("peers-r0-a", "ReceiveMessage", "q0"),
                        (None, "SendMessageBatch", "q1"), ("peers-r0-b", "ReceiveMessage", "q1")])
    found = peers.check_isolation(str(recording), _drains(("peers-r0-a", "q0", 1),
                                                          ("peers-r0-b", "q1", 1)))
    assert found == {"checked": True, "drains": 2, "requests": 2, "receives": 2}


@pytest.mark.parametrize("requests, error", [
    # the first child's long poll arrives once the second child has started
    ([("peers-r0-a", "ReceiveMessage", "q0"), ("peers-r0-b", "ReceiveMessage", "q1"),
      ("peers-r0-a", "ReceiveMessage", "q0")], "after peers-r0-b had started"),
    # a child receives from another's queue
    ([("peers-r0-a", "ReceiveMessage", "q1"), ("peers-r0-b", "ReceiveMessage", "q1")],
     "not its queue q0"),
    # the endpoint saw a request the child did not count
    ([("peers-r0-a", "ReceiveMessage", "q0"), ("peers-r0-a", "ReceiveMessage", "q0"),
      ("peers-r0-b", "ReceiveMessage", "q1")], "the endpoint got 2 requests"),
])
def test_isolation_fails_naming_the_leak(tmp_path, requests, error):
    recording = tmp_path / "rec.jsonl"
    _record(recording, requests)
    with pytest.raises(AssertionError, match=error):
        peers.check_isolation(str(recording), _drains(("peers-r0-a", "q0", 1),
                                                      ("peers-r0-b", "q1", 1)))
