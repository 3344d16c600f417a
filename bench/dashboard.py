"""The dashboard on a deep DLQ: a channel page over BENCH_DLQ_DEPTH (default 10,000) dead letters
reads one page (50, then 100), not the whole queue; and what one overview refresh costs.

Figures: requests and seconds of the channel page (target: ReceiveMessage calls <= page / 10 +
1, i.e. independent of the depth), of `?limit=100`, of a letter's page found deep in the DLQ
(the workbench scans until it sees the id), and of one overview fragment. Served by the real
app under uvicorn on loopback; requests counted with botocore's 'before-send' event. Runs
against a child-process local endpoint or AWS_ENDPOINT_URL if set. Prints JSON.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.request
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.job_ops import DEPTH, fill_dlq  # noqa: E402
from messenger.aws import ClientFactory, RequestCounter  # noqa: E402
from messenger.settings import Settings  # noqa: E402
from messenger.tools.dashboard.app import PAGE_SIZE, Dashboard, running  # noqa: E402
from messenger.tools.local import endpoint_from_env  # noqa: E402


def timed(url: str, counter: RequestCounter) -> dict[str, Any]:
    before, receives = counter.total, counter.counts["sqs.ReceiveMessage"]
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as response:
        page = response.read().decode()
    return {"seconds": round(time.perf_counter() - started, 3),
            "requests": counter.total - before,
            "receives": counter.counts["sqs.ReceiveMessage"] - receives,
            "letters_listed": page.count("data-letter=")}


def main() -> dict[str, Any]:
    with endpoint_from_env():
        settings = Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}")
        fill_dlq(ClientFactory(settings.region), settings)
        clients = ClientFactory(settings.region)
        counter = RequestCounter().attach(clients)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with running(Dashboard(settings, clients, port)) as url:
            result = {
                "depth": DEPTH,
                "channel_page": timed(f"{url}/channels/bench_dlq", counter),
                "channel_page_100": timed(f"{url}/channels/bench_dlq?limit=100", counter),
                "letter_deep": timed(f"{url}/channels/bench_dlq/letters/job-{DEPTH // 2}",
                                     counter),
                "overview_fragment": timed(f"{url}/fragment/channels", counter),
            }
        page = result["channel_page"]
        result["target_receives"] = PAGE_SIZE // 10 + 1
        result["meets_target"] = (page["letters_listed"] == PAGE_SIZE
                                  and page["receives"] <= result["target_receives"])
        return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
