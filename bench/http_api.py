"""The HTTP job API's cost against `push`, in one run: AWS requests per job and enqueue latency.

Enqueues JOBS jobs (BENCH_JOBS, default 200) to one channel three ways, alternating in rounds:
`Producer.push` called directly, `POST /channels/{channel}/jobs` on the local API (`JobApi` behind
`messenger.api.local.LocalApi`, the Lambda's code), and the same POST with an Idempotency-Key.
Counts the AWS requests the producers make per job (botocore's 'before-send') and times each
enqueue as its caller sees it (the POST: HTTP round trip included). Runs against a child-process
moto server (it does not share this process's GIL) or AWS_ENDPOINT_URL if set. Prints JSON.
Absolute latencies are moto's and the machine's: compare the ways, not the numbers.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger.api.app import JobApi  # noqa: E402
from messenger.api.channels import ApiChannel  # noqa: E402
from messenger.api.local import LocalApi  # noqa: E402
from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "200"))
ROUNDS = 4
CHANNEL = "bench_http"


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _post(url: str, key: str | None) -> None:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(url, data=json.dumps({"body": {"n": 1}}).encode(),
                                     method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 202, response.status


def main() -> dict[str, Any]:
    with endpoint_from_env():
        settings = Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}")
        clients = ClientFactory(settings.region)
        api = JobApi({CHANNEL: ApiChannel(CHANNEL)}, settings, clients)
        # `push` on a producer of the same channel, as the API makes it
        producer = api.channels[CHANNEL].producer_class(api.idempotency_window)(settings, clients)
        with LocalApi(api) as local:
            url = f"{local.url}/channels/{CHANNEL}/jobs"
            ways: dict[str, Callable[[], None]] = {
                "push": lambda: producer.push({"n": 1}),
                "http": lambda: _post(url, None),
                "http_idempotency_key": lambda: _post(url, uuid.uuid4().hex),
            }
            for enqueue in ways.values():  # warm up: provisioning, tables, connections
                enqueue()
            latencies: dict[str, list[float]] = {name: [] for name in ways}
            counters = {name: RequestCounter() for name in ways}
            for _ in range(ROUNDS):
                for name, enqueue in ways.items():
                    counters[name].attach(clients)
                    for _ in range(JOBS // ROUNDS):
                        started = time.perf_counter()
                        enqueue()
                        latencies[name].append(time.perf_counter() - started)
                    counters[name].detach(clients)
    jobs = JOBS // ROUNDS * ROUNDS
    return {
        "jobs_per_way": jobs,
        "ways": {name: {
            "aws_requests_per_job": round(counters[name].total / jobs, 3),
            "requests": dict(counters[name].counts),
            "p50_ms": round(statistics.median(values) * 1000, 2),
            "p99_ms": round(_percentile(values, 0.99) * 1000, 2),
        } for name, values in latencies.items()},
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
