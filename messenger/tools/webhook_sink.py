"""A local stand-in for a Slack incoming webhook: records what the ops Lambdas post.

    with WebhookSink() as sink:          # http://127.0.0.1:<free port>/services/...
        ...store sink.url in the webhook secret, run a handler...
        print(render_text(sink.posts[-1]))

Used by the tests and the local demo (stdlib only). Failure modes, to exercise retries and
deadlines (each post still counts in `requests`):

- `fail_status = 500` (or 503...): every post is answered with that status;
- `fail_status = 429` with `retry_after = 30`: rate limited, with a Retry-After header;
- `fail_times = n`: only the first n posts fail, the later ones are delivered;
- `hang = True`: a post is read and never answered (until `close()`), like a hung Slack.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from messenger.tools.local import LOOPBACK


class WebhookSink:
    """An HTTP server on loopback that stores each posted JSON body in `posts`."""

    def __init__(self, host: str = LOOPBACK, port: int = 0) -> None:
        self.posts: list[dict[str, Any]] = []
        self.requests = 0
        self.fail_status: int | None = None
        self.retry_after: int | None = None
        self.fail_times: int | None = None
        self.hang = False
        self._closed = threading.Event()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with sink._lock:
                    sink.requests += 1
                    failing = sink.fail_times is None or sink.requests <= sink.fail_times
                    status = (sink.fail_status or 200) if failing else 200
                    hang = sink.hang and failing
                    if status == 200 and not hang:
                        sink.posts.append(json.loads(body))
                if hang:
                    sink._closed.wait()
                    return
                reply = {200: b"ok", 429: b"rate_limited"}.get(status, b"server_error")
                self.send_response(status)
                if status == 429 and sink.retry_after is not None:
                    self.send_header("Retry-After", str(sink.retry_after))
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass  # no access log

        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), Handler)
        bound_host, bound_port = self._server.server_address[:2]
        if isinstance(bound_host, bytes):  # only for AF_UNIX sockets, never here
            bound_host = bound_host.decode()
        self.url = f"http://{bound_host}:{bound_port}/services/T000/B000/XXXX"
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def texts(self) -> list[str]:
        """The blocks of each post as JSON text (for 'is this name in it' checks)."""
        return [json.dumps(post.get("blocks", []), ensure_ascii=False) for post in self.posts]

    def close(self) -> None:
        self._closed.set()  # hung requests end
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookSink:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m messenger.tools.webhook_sink [--port N]`: print the URL, then every post as
    Slack lays it out (messenger.ops.report.render_text), until Ctrl-C."""
    import argparse
    import time

    from messenger.ops.report import render_text

    parser = argparse.ArgumentParser(prog="python -m messenger.tools.webhook_sink")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    args = parser.parse_args(argv)
    sink = WebhookSink(port=args.port)
    print(f"Slack webhook sink: {sink.url}", flush=True)
    shown = 0
    try:
        while True:
            time.sleep(0.2)
            with sink._lock:
                new, shown = sink.posts[shown:], len(sink.posts)
            for post in new:
                print(render_text(post), flush=True)
    except KeyboardInterrupt:
        return 0
    finally:
        sink.close()


if __name__ == "__main__":
    raise SystemExit(main())
