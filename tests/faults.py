"""Fault injection through botocore's event hooks: the real client, the real retry logic.

`Throttle(rate)` registered on 'before-send' answers a share of requests with the service's own
throttling error instead of sending them, so botocore parses and retries it exactly as a real
throttled response. `FailOnCall(nth)` on 'before-call' makes one call fail like a dropped
connection; `injected(clients, event, hook)` registers a hook for the duration of a block.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.exceptions import EndpointConnectionError

from messenger.aws import ClientFactory


class _RawBody:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Any:
        yield self._data

    def read(self, *_: Any) -> bytes:
        data, self._data = self._data, b""
        return data


def aws_response(url: str, status: int, headers: dict[str, str], body: bytes) -> AWSResponse:
    """An answer a `before-send` hook returns instead of sending the request: botocore parses
    it (status, headers, body) and retries it exactly as the service's own."""
    return AWSResponse(url, status, headers, _RawBody(body))


def throttling_response(protocol: str, url: str) -> AWSResponse:
    """A 400 throttling error in the wire format of `protocol`."""
    if protocol == "json":
        body = b'{"__type":"com.amazonaws.sqs#ThrottlingException","message":"Rate exceeded"}'
        headers = {
            "Content-Type": "application/x-amz-json-1.0",
            "x-amzn-query-error": "Throttling;Sender",
        }
    else:
        body = (
            b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code>"
            b"<Message>Rate exceeded</Message></Error><RequestId>x</RequestId></ErrorResponse>"
        )
        headers = {"Content-Type": "text/xml"}
    return AWSResponse(url, 400, headers, _RawBody(body))


@contextmanager
def injected(clients: ClientFactory, event: str, hook: Callable[..., Any]) -> Iterator[None]:
    """`hook` registered on `event` of every client of `clients` while the block runs."""
    clients.register(event, hook)
    try:
        yield
    finally:
        clients.unregister(event, hook)


class AccessDenied:
    """botocore `before-send` hook (register it on 'before-send.sqs.DeleteQueue'): a request
    naming one of `names` (in its body) is answered with SQS's 403 AccessDenied, as an IAM
    policy that does not allow it would; `refused` counts those."""

    def __init__(self, *names: str) -> None:
        self.names, self.refused = names, 0

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        body = request.body.decode() if isinstance(request.body, bytes) else str(request.body)
        if not any(f'/{name}"' in body for name in self.names):
            return None
        self.refused += 1
        payload = (b'{"__type":"com.amazonaws.sqs#AccessDenied","message":"User: arn:aws:sts::'
                   b'123456789012:assumed-role/cleaner is not authorized to perform: '
                   b'sqs:deletequeue"}')
        headers = {"Content-Type": "application/x-amz-json-1.0",
                   "x-amzn-query-error": "AccessDenied;Sender"}
        return AWSResponse(request.url, 403, headers, _RawBody(payload))


class FailOnCall:
    """botocore `before-call` hook: the `nth` call (1-based) fails like a dropped connection
    (EndpointConnectionError, which is not a ClientError)."""

    def __init__(self, nth: int) -> None:
        self.nth, self.calls = nth, 0

    def __call__(self, model: Any = None, **_: Any) -> None:
        self.calls += 1
        if self.calls == self.nth:
            raise EndpointConnectionError(endpoint_url="https://aws.example/unreachable")


class Throttle:
    """Throttle `rate` (0..1) of the requests whose operation is in `operations` (None: all),
    `times` of them at most (None: no limit)."""

    def __init__(self, rate: float, operations: set[str] | None = None, seed: int = 7,
                 times: int | None = None) -> None:
        self.rate = rate
        self.operations = operations
        self.times = times
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.injected = 0
        self.passed = 0

    def __call__(self, request: Any, event_name: str = "", **kwargs: Any) -> AWSResponse | None:
        operation = event_name.split(".")[-1]
        if self.operations is not None and operation not in self.operations:
            return None
        with self.lock:
            hit = self.random.random() < self.rate and (
                self.times is None or self.injected < self.times)
            if hit:
                self.injected += 1
            else:
                self.passed += 1
        if not hit:
            return None
        protocol = (
            "json" if "x-amz-json" in str(request.headers.get("Content-Type", "")) else "query"
        )
        return throttling_response(protocol, request.url)


class Blackhole:
    """A TCP server on loopback that accepts connections and never answers: what a hung
    endpoint or a silently dropping network path looks like to a client."""

    def __init__(self) -> None:
        import socket

        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections: list[Any] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            self.connections.append(connection)  # held open, never read from or written to

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        for connection in self.connections:
            connection.close()
