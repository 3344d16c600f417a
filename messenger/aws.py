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

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from messenger import fastboto
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

#: botocore retries each call this often (standard mode: exponential backoff with jitter)
#: before the retry budget below takes over.
BOTOCORE_MAX_ATTEMPTS = 4
#: Seconds to connect, and to wait for a response once sent (per attempt). An endpoint that
#: accepts connections and never answers costs at most this much past the retry budget.
CONNECT_TIMEOUT_SECONDS = 5.0
CALL_TIMEOUT_SECONDS = 15.0
#: A call outside `call_with_budget` stops retrying (timed-out, broken or throttled attempts)
#: after this long.
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


def retry_deadline() -> float | None:
    """When botocore stops retrying this thread's current call (monotonic seconds): inside
    `call_with_budget` its budget's, else the call's own (`ClientFactory.call_budget` from its
    start)."""
    deadline = getattr(_budget, "deadline", None)
    return getattr(_budget, "call_deadline", None) if deadline is None else deadline


def _stop_retrying_past_the_budget(**_: Any) -> bool | None:
    """botocore `needs-retry.<service>` hook, registered first, for clients off the paths of
    `messenger.fastboto` (which hold botocore's retries to `retry_deadline` by wrapping its
    retry handler, `fastboto.bound_retries`): once the deadline has passed, botocore retries no
    attempt, a throttled or 5xx response (botocore raises its `ClientError`) or a broken one
    (it raises the exception). False is a non-None answer, which ends the retries. Public hooks
    only, so botocore's handler still runs after it (the endpoint asks every handler) and takes
    a retry token for a retry not made, and a backoff chosen before the deadline is slept in
    full."""
    deadline = retry_deadline()
    if deadline is not None and time.monotonic() >= deadline:
        return False
    return None


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
    """Makes one boto3 client per service on first use; thread-safe. Its clients take the
    fast paths of `messenger.fastboto` (cheaper signing, parsing, request bodies and
    User-Agent) when the installed botocore is the one they were verified against or
    MESSENGER_FAST_BOTOCORE=1, and are plain botocore otherwise (`fast_paths` says which and
    why; MESSENGER_FAST_BOTOCORE is read when the factory is made).

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
        #: stops retrying (botocore's retries of timed-out, broken, throttled or 5xx attempts
        #: included, and no backoff sleeps past it): it ends within this plus one attempt.
        self.call_budget = call_budget
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, bool, float | None, bool], Any] = {}
        self._hooks: list[tuple[str, Callable[..., Any]]] = []
        #: Whether the clients take `messenger.fastboto`'s fast paths, and why.
        self.fast_paths = fastboto.FastPaths.from_env()

    def client(
        self, service: str, long_poll: bool = False, read_timeout: float | None = None,
        validate_params: bool = True,
    ) -> Any:
        """The service's client; `long_poll`: one whose read timeout also covers a 20 s
        ReceiveMessage wait (a consumer's mailbox); `read_timeout`: a client of its own with
        this read timeout (seconds), e.g. for lease renewals that must answer within a lease;
        `validate_params=False`: a client of its own that skips botocore's check of every
        parameter, for callers that build requests only from values they checked themselves
        (and, on the fast paths, writes plain JSON request bodies in one step)."""
        key = (service, long_poll, read_timeout, validate_params)
        with self._lock:
            existing = self._clients.get(key)
            if existing is not None:
                return existing
            core = botocore.session.get_session()
            if self.fast_paths.on:
                fastboto.prepare_session(core)
            session = _genuine_session_class()(botocore_session=core, region_name=self.region)
            timeout = self.call_timeout if read_timeout is None else read_timeout
            timeout += LONG_POLL_SECONDS if long_poll else 0
            made = session.client(
                service, config=client_config(timeout, validate_params),
                endpoint_url=self.endpoint_url,
            )
            if not (self.fast_paths.on and fastboto.bound_retries(made, retry_deadline)):
                # on the service's own event: botocore's handler is there, and a handler of
                # the bare 'needs-retry' would come after it
                service_id = made.meta.service_model.service_id.hyphenize()
                made.meta.events.register_first(
                    f"needs-retry.{service_id}", _stop_retrying_past_the_budget)
            made.meta.events.register_first("before-call", self._start_call_clock)
            if self.fast_paths.on:
                fastboto.speed_up(made, planned_bodies=not validate_params)
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
    request: botocore's own retries inside `call` stop at the budget's deadline too, and their
    backoff does not sleep past it (`ClientFactory.client`)."""
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
