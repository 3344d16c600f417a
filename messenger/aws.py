"""boto3 clients made lazily, with botocore's retry configuration, and a retry budget on top.

No endpoint or region is hard-coded: boto3 reads `AWS_ENDPOINT_URL` (and the per-service
`AWS_ENDPOINT_URL_<SERVICE>`) itself, so the same code talks to the embedded moto server,
LocalStack or real AWS.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

import boto3
import botocore.session
from botocore.config import Config
from botocore.context import get_context
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from messenger.errors import PublishFailed, RetryBudgetExhausted
from messenger.responses import FastParserFactory
from messenger.serialize import use_planned_serializer
from messenger.signing import use_fast_signing

T = TypeVar("T")

#: Error codes that mean "try again later" on SQS, SNS, S3 and KMS.
TRANSIENT_ERROR_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
        "RequestLimitExceeded",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "KMSThrottlingException",
        "KMS.ThrottlingException",
    }
)
_TRANSIENT_EXCEPTIONS = (
    EndpointConnectionError,
    ConnectionClosedError,
    ConnectTimeoutError,
    ReadTimeoutError,
)

#: botocore retries each call this often (standard mode: exponential backoff with jitter)
#: before the retry budget below takes over.
BOTOCORE_MAX_ATTEMPTS = 4
#: Seconds to connect, and to wait for a response once sent (per attempt). An endpoint that
#: accepts connections and never answers costs at most this much past the retry budget.
CONNECT_TIMEOUT_SECONDS = 5.0
CALL_TIMEOUT_SECONDS = 15.0
#: A call outside `call_with_budget` stops retrying timed-out attempts after this long.
CALL_BUDGET_SECONDS = 20.0
#: ReceiveMessage long-polls up to this long before it answers.
LONG_POLL_SECONDS = 20

_budget = threading.local()


def client_config(
    read_timeout: float = CALL_TIMEOUT_SECONDS, validate_params: bool = True
) -> Config:
    return Config(
        retries={"mode": "standard", "max_attempts": BOTOCORE_MAX_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=read_timeout,
        max_pool_connections=50,
        parameter_validation=validate_params,
    )


def _stop_retrying_past_the_budget(caught_exception: BaseException | None = None,
                                   **_: Any) -> None:
    """botocore `needs-retry` hook: a timed-out or broken attempt is not retried by botocore
    once the deadline has passed: inside `call_with_budget` its budget's, else the call's own
    (`ClientFactory.call_budget` from its start). Each attempt may take a whole call timeout, so
    botocore's own retries would otherwise run far past either."""
    deadline = getattr(_budget, "deadline", None)
    if deadline is None:
        deadline = getattr(_budget, "call_deadline", None)
    if caught_exception is not None and deadline is not None and time.monotonic() >= deadline:
        raise caught_exception


def _encode_form_once(request: Any = None, **_: Any) -> None:
    """botocore `before-sign` hook: url-encode a query-protocol body (SNS) here, once. botocore
    otherwise encodes the parameters twice per attempt (for the payload hash, then to send),
    which is a fifth of a 10-entry PublishBatch's client CPU. The bytes are botocore's own
    (`AWSRequestPreparer._prepare_body`); other bodies (JSON, XML, streams) are left alone."""
    data = request.data
    if isinstance(data, dict):
        request.data = urlencode([(_utf8(k), _utf8(v)) for k, v in data.items()], doseq=True)


def _utf8(value: Any) -> Any:
    return value.encode("utf-8") if isinstance(value, str) else value


#: Distinct feature sets whose User-Agent string a client keeps (a client sees a handful).
_USER_AGENTS_KEPT = 64


def _reuse_user_agent(client: Any) -> None:
    """Build a client's User-Agent header once per set of feature ids instead of twice per
    request. botocore rebuilds the whole string on every request (once for the request, again
    after the request registered its feature ids, e.g. the retry mode): ~8% of an SQS call's
    client CPU. Everything in it but those feature ids is fixed when the client is made, so
    the string is kept per feature set: the header sent is the one botocore builds. A botocore
    without the attribute is left alone."""
    creator = getattr(client, "_user_agent_creator", None)
    build = getattr(creator, "to_string", None)
    if creator is None or not callable(build):
        return
    built: dict[frozenset[str], str] = {}

    def to_string() -> str:
        context = get_context()
        features = frozenset(context.features) if context is not None else frozenset()
        found = built.get(features)
        if found is None:
            found = build()
            if len(built) < _USER_AGENTS_KEPT:
                built[features] = found
        return found

    creator.to_string = to_string


def _genuine_session_class() -> type[boto3.session.Session]:
    """boto3's own `Session` class, also after another package replaced `boto3.session.Session`
    process-wide: AWS's `sqs_extended_client` does on import, and the SQS clients of its session
    rewrite receipt handles and bodies, which breaks this library's deletes. Its class subclasses
    boto3's, so boto3's is found in the MRO."""
    for cls in boto3.session.Session.__mro__:
        if cls.__module__ == "boto3.session" and cls.__name__ == "Session":
            return cls
    return boto3.session.Session


class ClientFactory:
    """Makes one boto3 client per service on first use; thread-safe. Its clients parse
    ReceiveMessage responses faster (`messenger.responses`), build their User-Agent once and
    sign with botocore's SigV4 made cheaper (`messenger.signing`).

    Hooks registered with `register` (botocore event name, handler) apply to every client
    made before or after, which is how benchmarks count requests and tests inject faults.
    """

    def __init__(
        self, region: str, endpoint_url: str | None = None,
        call_timeout: float = CALL_TIMEOUT_SECONDS, call_budget: float = CALL_BUDGET_SECONDS,
    ) -> None:
        self.region = region
        #: None: boto3's own resolution (AWS_ENDPOINT_URL, then AWS).
        self.endpoint_url = endpoint_url
        #: Seconds an attempt may wait for its response (long polls: plus their wait).
        self.call_timeout = call_timeout
        #: Seconds after which a call made outside `call_with_budget` (a CLI's, a Lambda's)
        #: stops retrying timed-out attempts: it ends within this plus one attempt.
        self.call_budget = call_budget
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, bool, float | None, bool], Any] = {}
        self._hooks: list[tuple[str, Callable[..., Any]]] = []

    def client(
        self, service: str, long_poll: bool = False, read_timeout: float | None = None,
        validate_params: bool = True,
    ) -> Any:
        """The service's client; `long_poll`: one whose read timeout also covers a 20 s
        ReceiveMessage wait (a consumer's mailbox); `read_timeout`: a client of its own with
        this read timeout (seconds), e.g. for lease renewals that must answer within a lease;
        `validate_params=False`: a client of its own that skips botocore's check of every
        parameter, for callers that build requests only from values they checked themselves
        (and writes plain JSON request bodies in one step: `messenger.serialize`)."""
        key = (service, long_poll, read_timeout, validate_params)
        with self._lock:
            existing = self._clients.get(key)
            if existing is not None:
                return existing
            core = botocore.session.get_session()
            core.register_component("response_parser_factory", FastParserFactory())
            session = _genuine_session_class()(botocore_session=core, region_name=self.region)
            timeout = self.call_timeout if read_timeout is None else read_timeout
            timeout += LONG_POLL_SECONDS if long_poll else 0
            made = session.client(
                service, config=client_config(timeout, validate_params),
                endpoint_url=self.endpoint_url,
            )
            made.meta.events.register_first("needs-retry", _stop_retrying_past_the_budget)
            made.meta.events.register_first("before-call", self._start_call_clock)
            made.meta.events.register("before-sign", _encode_form_once)
            _reuse_user_agent(made)
            use_fast_signing(made)
            if not validate_params:
                use_planned_serializer(made)
            for event, handler in self._hooks:
                made.meta.events.register(event, handler)
            self._clients[key] = made
            return made

    def _start_call_clock(self, **_: Any) -> None:
        """botocore `before-call` hook: the call's own deadline (used outside a budget)."""
        _budget.call_deadline = time.monotonic() + self.call_budget

    def register(self, event: str, handler: Callable[..., Any]) -> None:
        with self._lock:
            self._hooks.append((event, handler))
            for made in self._clients.values():
                made.meta.events.register(event, handler)

    def unregister(self, event: str, handler: Callable[..., Any]) -> None:
        with self._lock:
            self._hooks = [(e, h) for e, h in self._hooks if (e, h) != (event, handler)]
            for made in self._clients.values():
                made.meta.events.unregister(event, handler)


class RequestCounter:
    """Counts HTTP requests (retries included) per 'service.Operation' through botocore's events."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        # event_name is 'before-send.<service>.<Operation>'
        key = ".".join(event_name.split(".")[1:3])
        with self._lock:
            self.counts[key] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def attach(self, factory: ClientFactory) -> RequestCounter:
        factory.register("before-send", self)
        return self

    def detach(self, factory: ClientFactory) -> None:
        factory.unregister("before-send", self)


def error_code(error: BaseException) -> str:
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code", ""))
    return ""


def is_transient(error: BaseException) -> bool:
    """Whether an error is worth retrying: throttling, 5xx or a broken connection."""
    if isinstance(error, _TRANSIENT_EXCEPTIONS):
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return error_code(error) in TRANSIENT_ERROR_CODES or int(status or 0) >= 500
    return False


def call_with_budget(
    call: Callable[[], T],
    budget_seconds: float,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
    error: type[RetryBudgetExhausted] = PublishFailed,
) -> T:
    """Run `call`, retrying transient errors with capped exponential backoff and full jitter
    until `budget_seconds` have passed; then raise `error` (default PublishFailed) naming
    `what`.
    Non-transient errors propagate at once. Wall time is bounded by the budget plus one attempt
    (connect + call timeout), also against an endpoint that never answers."""
    deadline = time.monotonic() + budget_seconds
    attempt = 0
    while True:
        outer = getattr(_budget, "deadline", None)
        _budget.deadline = deadline if outer is None else min(outer, deadline)
        try:
            return call()
        except Exception as failure:
            if not is_transient(failure):
                raise
            attempt += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise error(
                    f"{what} failed after {attempt} attempts within the {budget_seconds:g} s "
                    f"retry budget: {failure}"
                ) from failure
            sleep(min(remaining, random.uniform(0, min(2.0, 0.05 * 2**attempt))))
        finally:
            _budget.deadline = outer
