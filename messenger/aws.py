"""boto3 clients made lazily, whose retries are held to a retry budget, through public hooks only.

Every client makes one attempt per try (botocore's retry configuration) and its retries are
decided by `BoundedRetries`, a handler of botocore's public `needs-retry` event: a call ends
within its deadline plus one attempt, and no backoff sleeps past the deadline, on every botocore
version (docs/fast-botocore.md says why messenger no longer replaces any of botocore's code).

No endpoint or region is hard-coded: boto3 reads `AWS_ENDPOINT_URL` (and the per-service
`AWS_ENDPOINT_URL_<SERVICE>`) itself, so the same code talks to the embedded moto server,
LocalStack or real AWS.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from messenger.errors import PublishFailed, RetryBudgetExhausted

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

#: Attempts per call (the first and 4 retries, made by `BoundedRetries`, as many as botocore
#: made with `max_attempts=4` before) before the retry budget's own loop (`call_with_budget`)
#: takes over.
MAX_ATTEMPTS = 5
#: The backoff before the n-th retry is drawn from 0 .. min(RETRY_BACKOFF_CAP_SECONDS,
#: RETRY_BACKOFF_BASE_SECONDS * 2**(n-1)) (full jitter, as botocore's standard mode draws it),
#: then capped at the time left before the deadline.
RETRY_BACKOFF_BASE_SECONDS = 1.0
RETRY_BACKOFF_CAP_SECONDS = 20.0
#: Seconds to connect, and to wait for a response once sent (per attempt). An endpoint that
#: accepts connections and never answers costs at most this much past the retry budget.
CONNECT_TIMEOUT_SECONDS = 5.0
CALL_TIMEOUT_SECONDS = 15.0
#: A call outside `call_with_budget` stops retrying (timed-out, broken or throttled attempts)
#: after this long.
CALL_BUDGET_SECONDS = 20.0
#: ReceiveMessage long-polls up to this long before it answers.
LONG_POLL_SECONDS = 20

#: Error codes a call's attempt is retried on: the transient ones above and those botocore's
#: standard retry mode retries (throttling and transient codes of every AWS service, e.g.
#: DynamoDB's ProvisionedThroughputExceededException), so a client loses none of botocore's
#: retries by having `BoundedRetries` make them.
RETRIED_ERROR_CODES = TRANSIENT_ERROR_CODES.union(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "EC2ThrottledException",
    }
)
#: HTTP statuses an attempt is retried on whatever its error code (429: throttled).
RETRIED_STATUS_CODES = frozenset({429, 500, 502, 503, 504})
#: Exceptions an attempt is retried on: a connection not made, broken or timed out
#: (botocore's public classes; its standard mode retries the same).
RETRIED_EXCEPTIONS = (BotocoreConnectionError, HTTPClientError)

_budget = threading.local()


def client_config(
    read_timeout: float = CALL_TIMEOUT_SECONDS, validate_params: bool = True
) -> Config:
    """The configuration of every client the factory makes. botocore makes one attempt per
    call (`total_max_attempts=1`: its own retries would sleep a backoff chosen without the
    deadline); `BoundedRetries` makes the retries."""
    return Config(
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=read_timeout,
        max_pool_connections=50,
        parameter_validation=validate_params,
    )


def retry_deadline() -> float | None:
    """When this thread's current call stops retrying (monotonic seconds): inside
    `call_with_budget` its budget's, else the call's own (`ClientFactory.call_budget` from its
    start)."""
    deadline = getattr(_budget, "deadline", None)
    return getattr(_budget, "call_deadline", None) if deadline is None else deadline


@contextmanager
def deadline_scope(deadline: float) -> Iterator[None]:
    """Every call this thread makes inside the block stops retrying at `deadline` (monotonic
    seconds), or earlier at an enclosing scope's or `call_with_budget`'s: no retry and no backoff
    after it (`BoundedRetries`). One deadline for all the calls of, e.g., an API request."""
    outer = getattr(_budget, "deadline", None)
    _budget.deadline = deadline if outer is None else min(outer, deadline)
    try:
        yield
    finally:
        _budget.deadline = outer


class BoundedRetries:
    """botocore `needs-retry.<service>` handler, registered first on every client the factory
    makes: it decides each retry of a call, and no retry passes `deadline()`.

    botocore emits `needs-retry` after every attempt and sleeps the first answer that is not
    None, then retries (False: it does not). This handler answers, for an attempt that failed
    in a way worth retrying (`RETRIED_ERROR_CODES`, `RETRIED_STATUS_CODES`, an error the
    operation's model marks retryable, `RETRIED_EXCEPTIONS`) while fewer than `max_attempts`
    were made and the deadline has not passed: a backoff with full jitter, capped at the time
    left; for any other attempt, False (no retry). Public events and models only: botocore's
    own handler runs after it and never retries (`client_config`: one attempt), so a call ends
    within the deadline plus one attempt on any botocore version.

    `deadline`: monotonic seconds (None: no deadline); `clock`, `draw` (uniform in 0..x):
    stand-ins for tests.
    """

    def __init__(
        self, deadline: Callable[[], float | None] = retry_deadline,
        max_attempts: int = MAX_ATTEMPTS,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[float], float] = lambda high: random.uniform(0, high),
    ) -> None:
        self.deadline, self.max_attempts = deadline, max_attempts
        self.clock, self.draw = clock, draw

    def __call__(
        self, attempts: int = 1, response: Any = None, caught_exception: Any = None,
        operation: Any = None, **_: Any,
    ) -> float | bool:
        if attempts >= self.max_attempts or not _worth_retrying(
                response, caught_exception, operation):
            return False
        delay = self.draw(min(RETRY_BACKOFF_CAP_SECONDS,
                              RETRY_BACKOFF_BASE_SECONDS * 2 ** (attempts - 1)))
        deadline = self.deadline()
        if deadline is None:
            return delay
        left = deadline - self.clock()
        return False if left <= 0 else min(delay, left)


def _worth_retrying(response: Any, caught_exception: Any, operation: Any) -> bool:
    """Whether an attempt failed in a way worth retrying: `response` is botocore's
    (http response, parsed) pair, `caught_exception` what the attempt raised instead."""
    if caught_exception is not None:
        return isinstance(caught_exception, RETRIED_EXCEPTIONS)
    if response is None:
        return False
    http, parsed = response
    if http.status_code < 400:
        return False
    code = (parsed or {}).get("Error", {}).get("Code", "")
    if code in RETRIED_ERROR_CODES or http.status_code in RETRIED_STATUS_CODES:
        return True
    # an error the service's model marks retryable (the model is public: botocore.model)
    return bool(code) and any(
        shape.metadata.get("retryable") is not None and code in (shape.name, shape.error_code)
        for shape in getattr(operation, "error_shapes", ()))


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
    """Makes one boto3 client per service on first use; thread-safe. Its clients are plain
    botocore with one handler of messenger's on a public event: `BoundedRetries`, which makes
    their retries and holds them to the retry budget.

    Hooks registered with `register` (botocore event name, handler) apply to every client
    made before or after, which is how benchmarks count requests and tests inject faults.
    """

    def __init__(
        self, region: str, endpoint_url: str | None = None,
        call_timeout: float = CALL_TIMEOUT_SECONDS, call_budget: float = CALL_BUDGET_SECONDS,
        access_key: tuple[str, str] | None = None,
    ) -> None:
        self.region = region
        #: None: boto3's own resolution (AWS_ENDPOINT_URL, then AWS).
        self.endpoint_url = endpoint_url
        #: (key id, secret) the clients sign with; None: boto3's own credential chain. For a
        #: local endpoint's own clients (`messenger.tools.workflow_sweeper`), which need none.
        self.access_key = access_key
        #: Seconds an attempt may wait for its response (long polls: plus their wait).
        self.call_timeout = call_timeout
        #: Seconds after which a call made outside `call_with_budget` (a CLI's, a Lambda's)
        #: stops retrying (retries of timed-out, broken, throttled or 5xx attempts, and no
        #: backoff sleeps past it): it ends within this plus one attempt.
        self.call_budget = call_budget
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, bool, float | None, bool], Any] = {}
        self._hooks: list[tuple[str, Callable[..., Any]]] = []
        self._retries = BoundedRetries()

    def client(
        self, service: str, long_poll: bool = False, read_timeout: float | None = None,
        validate_params: bool = True,
    ) -> Any:
        """The service's client; `long_poll`: one whose read timeout also covers a 20 s
        ReceiveMessage wait (a consumer's mailbox); `read_timeout`: a client of its own with
        this read timeout (seconds), e.g. for lease renewals that must answer within a lease;
        `validate_params=False`: a client of its own that skips botocore's check of every
        parameter, for callers that build requests only from values they checked themselves."""
        key = (service, long_poll, read_timeout, validate_params)
        with self._lock:
            existing = self._clients.get(key)
            if existing is not None:
                return existing
            core = botocore.session.get_session()
            session = _genuine_session_class()(botocore_session=core, region_name=self.region)
            timeout = self.call_timeout if read_timeout is None else read_timeout
            timeout += LONG_POLL_SECONDS if long_poll else 0
            keys = {} if self.access_key is None else {
                "aws_access_key_id": self.access_key[0],
                "aws_secret_access_key": self.access_key[1]}
            made = session.client(
                service, config=client_config(timeout, validate_params),
                endpoint_url=self.endpoint_url, **keys,
            )
            # on the service's own event, first: botocore's handler is there (a handler of
            # the bare 'needs-retry' would come after it), and the first answer is the one
            service_id = made.meta.service_model.service_id.hyphenize()
            made.meta.events.register_first(f"needs-retry.{service_id}", self._retries)
            made.meta.events.register_first("before-call", self._start_call_clock)
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
    (connect + call timeout), also against an endpoint that never answers or throttles every
    request: the retries of a factory's client inside `call` stop at the budget's deadline too,
    and their backoff does not sleep past it (`BoundedRetries`)."""
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
