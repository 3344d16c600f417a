"""The consumer image with podman: build time, size, start to LISTENING, SIGTERM to exit.

Builds the examples image with consumer_image/build_local.sh (the engine and base images set up
first when missing: that setup is timed apart), then starts `examples.wishlist:AppleEventsConsumer`
in a container against a local endpoint ROUNDS times: seconds from `podman run` to LISTENING in
its log, and from `podman stop -t 30` to exit (with the exit code: 0 is a graceful SIGTERM).
No targets: figures for docs/performance.md (via bench/RESULTS.md). Prints JSON
({"skipped": reason} when no engine here).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from messenger.tools.local import LOCAL_CREDENTIALS, start_local_process  # noqa: E402
from tests.podman import (  # noqa: E402
    BUILD_SCRIPT,
    Container,
    EngineUnavailable,
    local_engine,
)

TAG = "localhost/messenger-consumer:local"  # build_local.sh's default: the examples image
BASE = "docker.io/library/python:3.11-slim"  # the stand-in
ROUNDS = 3


def timed(command: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(command, check=True, capture_output=True, timeout=900)
    return time.monotonic() - started


def main() -> dict[str, Any]:
    try:
        engine = local_engine()
    except EngineUnavailable as why:
        return {"skipped": str(why)}
    setup_s = timed([str(BUILD_SCRIPT), "--setup"])
    build_s = timed([str(BUILD_SCRIPT), "--tag", TAG])
    rebuild_s = timed([str(BUILD_SCRIPT), "--tag", TAG])

    def size_mb(image: str) -> float:
        return int(engine.run("image", "inspect", "--format", "{{.Size}}", image).stdout) / 1e6

    server = start_local_process()
    starts, stops, codes = [], [], []
    try:
        env = {**LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": server.url, "MESSENGER_NAMESPACE": "bench"}
        for _ in range(ROUNDS):
            container = Container(engine)
            try:
                started = time.monotonic()
                container.start(TAG, [], env)
                container.wait_for_state("LISTENING", timeout=60)
                starts.append(time.monotonic() - started)
                stopping = time.monotonic()
                engine.run("stop", "--time", "30", container.name, timeout=60)
                stops.append(time.monotonic() - stopping)
                codes.append(engine.inspect(container.name)["State"]["ExitCode"])
            finally:
                container.remove()
    finally:
        server.stop()
    return {
        "engine_setup_s": round(setup_s, 2),
        "build_s": round(build_s, 2),
        "rebuild_unchanged_s": round(rebuild_s, 2),
        "image_mb": round(size_mb(TAG), 1),
        "added_to_base_mb": round(size_mb(TAG) - size_mb(BASE), 1),
        "run_to_listening_s": round(statistics.median(starts), 2),
        "sigterm_to_exit_s": round(statistics.median(stops), 2),
        "exit_codes": codes,
        "rounds": ROUNDS,
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
