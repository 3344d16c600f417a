"""The dashboard on a deep DLQ: a channel page over BENCH_DLQ_DEPTH (default 10,000) dead letters
reads one page (50, then 100), not the whole queue; and what one overview refresh costs, with
BENCH_DASHBOARD_CHANNELS channels (default 100) in the namespace.

Also (issue 43): a filter's preview (one scan of 200), a search of every channel's dead letters
(10 per channel), the channel's history page (one GetMetricData) and the memory of the process
serving the app (RSS after the page views, and its peak). Goals, checked in `goals`: channel page
receives <= 50 / 10 + 1; preview receives <= 200 / 10 + 1; overview <= 5 requests per channel
+ 3; history <= the tag query's pages + 2 per queue + 1; search <= 5 requests per channel + 20
and under 10 s (only DLQs holding letters are read); RSS growth over the page views < 200 MiB.

Figures: requests and seconds of the channel page (target: ReceiveMessage calls <= page / 10 +
1, i.e. independent of the depth), of `?limit=100`, of a letter's page found deep in the DLQ
(the workbench scans until it sees the id), and of one overview fragment. Served by the real
app under uvicorn on loopback; requests counted with botocore's 'before-send' event. Runs
against a child-process local endpoint or AWS_ENDPOINT_URL if set. Prints JSON.
"""

from __future__ import annotations

import json
import os
import re
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


CHANNELS = int(os.environ.get("BENCH_DASHBOARD_CHANNELS", "100"))


def rss_mib(field: str = "VmRSS") -> float:
    """This process's resident memory (or its peak, VmHWM) in MiB (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    return -1.0


def main() -> dict[str, Any]:
    from messenger.channel import ChannelSpec
    from messenger.provision import Provisioner

    with endpoint_from_env():
        settings = Settings.from_env(namespace=f"b{uuid.uuid4().hex[:6]}")
        fill_dlq(ClientFactory(settings.region), settings)
        provisioner = Provisioner(ClientFactory(settings.region), settings)
        for n in range(CHANNELS - 1):  # bench_dlq is one
            provisioner.ensure_channel(ChannelSpec(f"other{n:03d}", namespace=settings.namespace))
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
            rss_before = rss_mib()
            result["channels"] = CHANNELS
            result["filter_preview_200"] = timed(
                f"{url}/channels/bench_dlq/select?reason=handler&limit=200", counter)
            result["history_hour"] = timed(f"{url}/channels/bench_dlq/history?window=hour",
                                           counter)
            # The search counts its own requests (a client factory of its own): read the page's.
            started = time.perf_counter()
            with urllib.request.urlopen(f"{url}/search?text=nothing-matches&per_channel=10",
                                        timeout=600) as response:
                text = response.read().decode()
            found = re.search(r'data-requests="(\d+)" data-scanned="(\d+)"', text)
            result["search_all_channels"] = {
                "seconds": round(time.perf_counter() - started, 3),
                "requests": int(found.group(1)) if found else -1,
                "letters_read": int(found.group(2)) if found else -1}
            result["memory_mib"] = {"rss_before_pages": rss_before, "rss_after": rss_mib(),
                                    "peak": rss_mib("VmHWM")}
        page = result["channel_page"]
        result["target_receives"] = PAGE_SIZE // 10 + 1
        result["meets_target"] = (page["letters_listed"] == PAGE_SIZE
                                  and page["receives"] <= result["target_receives"])
        memory = result["memory_mib"]
        result["goals"] = {
            "channel_page": result["meets_target"],
            "filter_preview": result["filter_preview_200"]["receives"] <= 200 // 10 + 1,
            "overview": result["overview_fragment"]["requests"] <= 5 * CHANNELS + 3,
            # one tag query (a page per 100 resources), GetQueueUrl + GetQueueAttributes for
            # the channel's queue, one GetMetricData
            "history": result["history_hour"]["requests"] <= (2 * CHANNELS) // 100 + 1 + 2 + 1,
            "search": 0 < result["search_all_channels"]["requests"] <= 5 * CHANNELS + 20
            and result["search_all_channels"]["seconds"] < 10,
            "memory": memory["rss_after"] - memory["rss_before_pages"] < 200,
        }
        return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
