"""The job API on loopback: real HTTP requests turned into API Gateway REST proxy events.

    with LocalApi(JobApi(channels, settings)) as api:    # a free port
        urllib.request.urlopen(f"{api.url}/jobs/{job_id}")

`messenger api` runs one in the foreground. Each request becomes the event API Gateway would
send the function (REST proxy integration, payload version 1.0: method, path, resource and path
parameters, headers in both forms, query string, body) and is answered by the same
`JobApi.handle` the Lambda runs; the response's status, headers and body go back as they are.
No authorization runs locally (loopback only): on AWS, IAM or Cognito checks every method
before the function runs.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from messenger.api.app import API_GATEWAY_TIMEOUT_SECONDS, JobApi

LOOPBACK = "127.0.0.1"
#: The API's resources, as API Gateway names them in `resource` (the CDK construct's paths).
RESOURCES = ("/channels/{channel}/jobs", "/channels/{channel}/jobs/batch", "/jobs/{id}")
#: The local stage name in `requestContext.stage` (paths carry no stage prefix locally).
LOCAL_STAGE = "local"


def _pattern(resource: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(resource)) + "$")


_PATTERNS = [(resource, _pattern(resource)) for resource in RESOURCES]


class LocalContext:
    """The Lambda context of one local request: 29 s, as API Gateway allows."""

    function_name = "messenger-api-local"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:local:000000000000:function:messenger-api-local"
    memory_limit_in_mb = 256

    def __init__(self) -> None:
        self.aws_request_id = str(uuid.uuid4())
        self._deadline = time.monotonic() + API_GATEWAY_TIMEOUT_SECONDS

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def proxy_event(method: str, target: str, headers: list[tuple[str, str]], body: bytes
                ) -> dict[str, Any]:
    """The REST proxy event (payload 1.0) API Gateway sends for this request."""
    parts = urlsplit(target)
    path = unquote(parts.path) or "/"
    resource, parameters = path, None
    for template, pattern in _PATTERNS:
        match = pattern.match(path)
        if match:
            resource, parameters = template, match.groupdict()
            break
    multi_headers: dict[str, list[str]] = {}
    for name, value in headers:
        multi_headers.setdefault(name, []).append(value)
    query = parse_qs(parts.query, keep_blank_values=True)
    try:
        text, encoded = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, encoded = base64.b64encode(body).decode("ascii"), True
    request_id = str(uuid.uuid4())
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": {name: values[-1] for name, values in multi_headers.items()},
        "multiValueHeaders": multi_headers,
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": parameters,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": resource, "httpMethod": method, "path": path,
            "stage": LOCAL_STAGE, "requestId": request_id, "extendedRequestId": request_id,
            "requestTimeEpoch": int(time.time() * 1000), "protocol": "HTTP/1.1",
            "identity": {"sourceIp": LOOPBACK, "caller": None, "user": None, "userArn": None},
            "accountId": "000000000000", "apiId": "local", "domainName": "localhost",
        },
        "body": text if body else None,
        "isBase64Encoded": encoded,
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        event = proxy_event(self.command, self.path, list(self.headers.items()), body)
        response = self.server.api.handle(event, LocalContext())
        payload = response.get("body") or ""
        data = base64.b64decode(payload) if response.get("isBase64Encoded") \
            else payload.encode("utf-8")
        self.send_response(int(response["statusCode"]))
        headers: dict[str, list[str]] = {k: list(v) for k, v in
                                         (response.get("multiValueHeaders") or {}).items()}
        for name, value in (response.get("headers") or {}).items():
            headers.setdefault(name, [str(value)])
        for name, values in headers.items():
            if name.lower() not in ("content-length", "connection"):
                for value in values:
                    self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer

    def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
        return


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    #: Connections waiting to be accepted (socketserver's default, 5, resets a burst's others).
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], api: JobApi) -> None:
        super().__init__(address, _Handler)
        self.api = api


class LocalApi:
    """`api` served over HTTP on `host:port` (0: a free port), in a thread of this process."""

    def __init__(self, api: JobApi, host: str = LOOPBACK, port: int = 0) -> None:
        self.api = api
        self._server = _Server((host, port), api)
        self._thread: threading.Thread | None = None
        bound_host, bound_port = self._server.server_address[:2]
        self.url = f"http://{bound_host!s}:{bound_port}"

    def start(self) -> LocalApi:
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="messenger-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> LocalApi:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_forever(api: JobApi, host: str = LOOPBACK, port: int = 0) -> int:
    """Serve `api` until SIGINT/SIGTERM, after printing where; returns the exit code."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with LocalApi(api, host, port) as local:
        print(f"messenger job API on {local.url} (no authorization: loopback only)", flush=True)
        for name, channel in sorted(api.channels.items()):
            print(f"  {name}: {json.dumps(channel.as_dict())}", flush=True)
        print(f"  curl -X POST {local.url}/channels/<channel>/jobs -H 'Content-Type: "
              f"application/json' -d '{{\"body\": ...}}'", flush=True)
        print("Ctrl-C stops it.", flush=True)
        stop.wait()
    print("stopped.", flush=True)
    return 0
