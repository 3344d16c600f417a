"""`JobApi`: the HTTP job API, Powertools' REST resolver over the channels' producers.

    POST /channels/{channel}/jobs         one job: 202 + {"job_id": ...} + Location: /jobs/{id}
    POST /channels/{channel}/jobs/batch   up to 10 jobs: per-job results, like `push_many`
    GET  /jobs/{id}                       the job's status timeline (channels that track status),
                                          its result or error, dependencies and dependents

Every job goes through the channel's own `Producer.push` / `push_many`, so offload, priorities,
routing keys, `max_attempts`, dedup and the QUEUED record are those of any Python producer.
An `Idempotency-Key` header makes the push run at most once per key and channel, on both POST
routes (Powertools' public `idempotent_function` on the idempotency table, the request's job or
batch as its payload): the same key and request again answer the first answer without sending;
another job or batch under the key is 422; a request still being accepted under the key is 409.
The key also becomes the job's message id (a UUID derived from channel and key, and a batch
job's index) pushed with dedup on, so a push whose record was lost (a crash between SQS and the
record) is still not sent twice within the window, and a consumer claiming job ids runs it once.

What a status code promises: 2xx only for jobs SQS (or SNS) accepted; once a job is accepted,
never a 5xx (a failure to record the idempotency result after the send is logged, not answered).
A request has one deadline (`handle`, `messenger.api.deadline`) shared by all its AWS calls.
"""

from __future__ import annotations

import base64
import contextvars
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timezone
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Header
from pydantic import ValidationError

from messenger.api.channels import CHANNELS_VARIABLE, ApiChannel, parse_channels
from messenger.api.deadline import DeadlineGuard, DeadlinePassed, RequestState
from messenger.api.requests import (
    MAX_IDEMPOTENCY_KEY_LENGTH,
    MAX_REQUEST_BYTES,
    BatchRequest,
    JobRequest,
    describe_errors,
)
from messenger.aws import ClientFactory, deadline_scope
from messenger.channel import ChannelSpec, idempotency_table_name
from messenger.errors import (
    ChannelNotFound,
    InvalidMessage,
    InvalidSettings,
    PayloadTooLarge,
    RetryBudgetExhausted,
)
from messenger.jobs.job_view import JobReader
from messenger.jobs.status import (
    StatusRecord,
    StatusStore,
    TrackingDeclarations,
    progress_answer,
)
from messenger.jobs.tables import EXPIRES_AT, ensure_table
from messenger.produce.producer import PushItem
from messenger.settings import Settings

logger = logging.getLogger("messenger.api")

#: Seconds an Idempotency-Key is remembered (the IETF draft suggests at least 24 hours).
DEFAULT_IDEMPOTENCY_WINDOW = 86_400
#: API Gateway ends an integration after 29 s: a request is never held in progress longer.
API_GATEWAY_TIMEOUT_SECONDS = 29
#: A request answers this long before its deadline (the function's remaining time, at most
#: API Gateway's 29 s): the answer's way back through Lambda and API Gateway.
ANSWER_MARGIN_SECONDS = 1.0
#: Retry-After (seconds) of a 429 (throttled past the retry budget) and a 409 (in progress).
RETRY_AFTER_THROTTLED = 5
RETRY_AFTER_IN_PROGRESS = 2
#: A job's status in a batch answer that says "send it again" (a batch answer holding one is
#: not kept under its Idempotency-Key).
RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
#: Namespace of the job ids derived from Idempotency-Keys.
IDEMPOTENT_ID_NAMESPACE = uuid.UUID("5d1f6a36-5b0e-4d3b-9c43-41c2a6c1e7a1")
JSON = "application/json"
#: The API's resources and their methods (a known resource with another method is a 405).
ROUTES = (("/channels/{channel}/jobs", "POST"), ("/channels/{channel}/jobs/batch", "POST"),
          ("/jobs/{id}", "GET"))
_ROUTE_PATTERNS = [(re.compile("^" + re.sub(r"\\\{(\w+)\\\}", "[^/]+", re.escape(path)) + "$"),
                    method) for path, method in ROUTES]
#: Failure codes of `push_many` that mean "try again later" (429) rather than a bad job (400).
RETRYABLE_CODES = {"PublishFailed", "RetryBudgetExhausted", "Throttling", "ThrottlingException",
                   "RequestThrottled", "ServiceUnavailable", "InternalError"}


class ApiError(Exception):
    """A request refused with `status` and a one-line `message` (and extra headers)."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass
class _Deadline:
    """What Powertools reads an in-progress record's expiry from (a Lambda context's method)."""

    millis: int

    def get_remaining_time_in_millis(self) -> int:
        return self.millis


def job_id_for_key(channel: str, key: str) -> str:
    """The message id of a job pushed with Idempotency-Key `key` (the same on every retry)."""
    return str(uuid.uuid5(IDEMPOTENT_ID_NAMESPACE, f"{channel}\n{key}"))


class JobApi:
    """The API over `channels` (name → ApiChannel). settings, clients: the producers'.
    idempotency_window: seconds a key's answer is kept (default 24 h; also the producers'
    dedup window). `handle(event, context)` answers one API Gateway REST proxy event."""

    def __init__(self, channels: Mapping[str, ApiChannel], settings: Settings,
                 clients: ClientFactory | None = None,
                 idempotency_window: int = DEFAULT_IDEMPOTENCY_WINDOW) -> None:
        if not channels:
            raise InvalidSettings("an HTTP job API needs at least one channel")
        self.channels = dict(channels)
        self.settings = settings
        self.clients = clients or ClientFactory(settings.region)
        self.idempotency_window = idempotency_window
        self._producers: dict[str, Any] = {}
        self._stores: dict[str, Any] = {}
        self._status: StatusStore | None = None
        self._reader: JobReader | None = None
        self._declarations: TrackingDeclarations | None = None
        self._lock = threading.Lock()
        self._table_ready = False
        #: Holds every AWS call of a request to the request's deadline (messenger.api.deadline).
        self.guard = DeadlineGuard().attach(self.clients)
        #: Powertools' router keeps the current event in a class attribute (one per process):
        #: requests served at once (`LocalApi`'s threads) read theirs in turn, until their route
        #: has taken what it needs (`_route_started`).
        self._routing = threading.Lock()
        self._holding = threading.local()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobApi:
        """The API of a deployed function: its channels from `MESSENGER_API_CHANNELS`, the
        settings from the environment (`Settings.from_env`), the idempotency window from
        `MESSENGER_API_IDEMPOTENCY_WINDOW` (seconds, default 24 h)."""
        env = os.environ if environ is None else environ
        raw = env.get(CHANNELS_VARIABLE)
        if not raw:
            raise InvalidSettings(f"{CHANNELS_VARIABLE} is not set: the channels the API serves")
        window = env.get("MESSENGER_API_IDEMPOTENCY_WINDOW") or DEFAULT_IDEMPOTENCY_WINDOW
        try:
            window = int(window)
        except ValueError:
            raise InvalidSettings(f"MESSENGER_API_IDEMPOTENCY_WINDOW must be whole seconds, got "
                                  f"{window!r}") from None
        return cls(parse_channels(raw), Settings.from_env(env), idempotency_window=window)

    # -- entry point -------------------------------------------------------------------------
    def handle(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        """Answer one REST proxy event, within the request's deadline: the function's remaining
        time, at most API Gateway's 29 s, less `ANSWER_MARGIN_SECONDS`. Size, content type and
        shape are checked before routing, as API Gateway checks them in front of the function.
        The route runs in a worker thread; if the deadline passes first, the answer is made from
        what its AWS calls did (`_late_answer`): 202 for a job SQS accepted, else 503."""
        started = time.monotonic()
        try:
            event = _checked_envelope(event)
        except ApiError as error:
            return _error_response(error)
        state = RequestState(answer_by=started + _remaining_millis(context) / 1000
                             - ANSWER_MARGIN_SECONDS)
        answered: list[dict[str, Any]] = []
        done = threading.Event()
        run = contextvars.copy_context().run  # the function's logger keys, in the worker too

        def work() -> None:
            self.guard.enter(state)
            try:
                # A router of its own: a router keeps the request's state on itself (a worker
                # still running after its late answer must not clear the next request's).
                router = self._routes()
                self._routing.acquire()
                self._holding.lock = True
                with deadline_scope(state.answer_by):  # no retry, no backoff past it
                    answered.append(_shaped(dict(router.resolve(event, context))))
            except Exception:  # an accepted job never raises out of a route; see _late_answer
                logger.exception("request failed")
                answered.append(_late_answer(state, event, failed=True))
            finally:
                self._route_started()
                self.guard.leave()
                done.set()

        threading.Thread(target=run, args=(work,), name="messenger-api-request",
                         daemon=True).start()
        if done.wait(max(0.0, state.answer_by - time.monotonic())):
            return answered[0]
        with state.lock:
            state.abandoned = True  # its later calls are refused: nothing is sent after this
        if done.is_set():
            return answered[0]
        logger.warning("request deadline passed after %.1f s; answering from what was sent",
                       time.monotonic() - started)
        return _late_answer(state, event, failed=False)

    # -- routes ------------------------------------------------------------------------------
    def _routes(self) -> APIGatewayRestResolver:
        app = APIGatewayRestResolver(enable_validation=True)

        @app.exception_handler(RequestValidationError)
        def invalid(error: RequestValidationError) -> Response:
            return _response(ApiError(400, describe_errors(error.errors())))

        @app.exception_handler(ApiError)
        def refused(error: ApiError) -> Response:
            state = self.guard.current()
            if error.status == 429 and state is not None and state.refused:
                return _response(_deadline_error(state))  # not throttled: out of time
            return _response(error)

        @app.not_found
        def not_found(_: Exception) -> Response:
            method, path = app.current_event.http_method, app.current_event.path
            allowed = [m for pattern, m in _ROUTE_PATTERNS if pattern.match(path)]
            if allowed:
                return _response(ApiError(405, f"{path} takes {', '.join(allowed)}, not {method}",
                                          {"Allow": ", ".join(allowed)}))
            return _response(ApiError(404, f"no route {method} {path}; routes: " + ", ".join(
                f"{m} {p}" for p, m in ROUTES)))

        @app.post("/channels/<channel>/jobs")
        def enqueue(
            channel: str, job: Annotated[JobRequest, Body()],
            idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        ):  # no return annotation: Powertools would validate the Response against it
            served = self._channel(channel)
            base = self._location(app, "")  # read once: the router's event is process-wide
            self._route_started()
            self._note(route="single", channel=served.name, base=base)
            if idempotency_key is None:
                accepted, replayed = self._push(served, job, None), False
            else:
                accepted, replayed = self._push_once(served, job, idempotency_key)
            headers = {"Location": base + accepted["job_id"]}
            if replayed:
                headers["Idempotent-Replayed"] = "true"
            body = {"job_id": accepted["job_id"], "channel": served.name, **accepted}
            return Response(202, JSON, json.dumps(body), headers=headers)

        @app.post("/channels/<channel>/jobs/batch")
        def enqueue_batch(
            channel: str, batch: Annotated[BatchRequest, Body()],
            idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        ):
            served = self._channel(channel)
            base = self._location(app, "")  # read once: the router's event is process-wide
            self._route_started()
            self._note(route="batch", channel=served.name, base=base,
                       size=len(batch.jobs))
            if idempotency_key is None:
                (status, results), replayed = self._push_batch(served, batch, None), False
            else:
                (status, results), replayed = self._push_batch_once(served, batch,
                                                                    idempotency_key)
            for result in results:
                if "job_id" in result:
                    result["location"] = base + result["job_id"]
            headers = {"Idempotent-Replayed": "true"} if replayed else {}
            if any(result.get("status") in RETRY_STATUSES for result in results):
                headers["Retry-After"] = str(RETRY_AFTER_THROTTLED)
            return Response(status, JSON, json.dumps(_batch_answer(status, served.name, results)),
                            headers=headers or None)

        @app.get("/jobs/<job_id>")
        def job_status(job_id: str):
            self._route_started()
            return Response(200, JSON, json.dumps(self._timeline(job_id)))

        return app

    # -- one job ------------------------------------------------------------------------------
    def _channel(self, name: str) -> ApiChannel:
        served = self.channels.get(name)
        if served is None:
            raise ApiError(404, f"unknown channel {name!r}; this API serves "
                                f"{', '.join(sorted(self.channels))}")
        return served

    def _push(self, channel: ApiChannel, job: JobRequest, message_id: str | None,
              dedup: bool | None = None) -> dict[str, str]:
        """Push one job (message_id: its id, None: the producer's; dedup: checked against the
        dedup window, None: when it has an id); what its answer says of it (`_accepted`).
        ApiError for what was not accepted."""
        item = _item(job, message_id, dedup)
        producer = self._producer(channel)
        pushed = _refusing(lambda: producer.push(
            item.body, item.routing_key, group_id=item.group_id, priority=item.priority,
            message_id=item.message_id, max_attempts=item.max_attempts, dedup=item.dedup,
            **_timing(job), **_dependencies(job)))
        self._flush_status(producer)
        return _accepted(pushed)

    def _push_once(self, channel: ApiChannel, job: JobRequest, key: str
                   ) -> tuple[dict[str, str], bool]:
        """Push under an Idempotency-Key; (the answer's job fields, whether it is a replay)."""
        job_id = job_id_for_key(channel.name, key)
        self._note(ids={job_id: 0})
        pushed: list[dict[str, str]] = []

        def push(request: dict[str, Any]) -> dict[str, str]:
            pushed.append(self._push(channel, job, job_id))
            return pushed[0]

        answer, replayed = self._once(channel, key, {"key": key, "job": job.model_dump(
            mode="json")}, push, pushed)
        return {name: str(value) for name, value in answer.items()}, replayed

    def _once(self, channel: ApiChannel, key: str, payload: dict[str, Any],
              run: Callable[[dict[str, Any]], Any], done: list[Any]) -> tuple[Any, bool]:
        """`run(payload)` at most once per key and channel (Powertools' `idempotent_function`
        on the idempotency table): (its answer, or the first request's; whether a replay).
        `done` holds run's answer once it ran. What the store does before `run` is a 503 with
        Retry-After (nothing was sent); after it, the answer stands and the failure is logged."""
        from aws_lambda_powertools.utilities.idempotency import (
            IdempotencyConfig,
            idempotent_function,
        )
        from aws_lambda_powertools.utilities.idempotency.exceptions import (
            IdempotencyAlreadyInProgressError,
            IdempotencyValidationError,
        )

        if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH or not key.isprintable():
            raise ApiError(400, f"Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable "
                                f"characters")
        state = self.guard.current()
        millis = int(max(0.0, state.left()) * 1000) if state is not None \
            else API_GATEWAY_TIMEOUT_SECONDS * 1000
        config = IdempotencyConfig(
            event_key_jmespath="key", payload_validation_jmespath="request",
            raise_on_no_idempotency_key=True, expires_after_seconds=self.idempotency_window,
            lambda_context=_Deadline(millis),  # type: ignore[arg-type]
        )
        try:
            store = self._store(channel)
            once = idempotent_function(run, data_keyword_argument="request", config=config,
                                       persistence_store=store, key_prefix=f"http#{channel.name}")
            answer = once(request={"key": key, "request": payload})
        except IdempotencyValidationError:
            raise ApiError(422, "Idempotency-Key was used with another job or batch on this "
                                "channel; use a new key for a new job") from None
        except IdempotencyAlreadyInProgressError:
            raise ApiError(409, "a request with this Idempotency-Key is still being accepted; "
                                "retry after it", {"Retry-After": str(RETRY_AFTER_IN_PROGRESS)}
                           ) from None
        except (ApiError, _Unsettled):
            raise
        except Exception as error:  # the table check, the in-progress or the success record
            if not done and state is not None and state.refused:
                raise _deadline_error(state) from None
            if not done:
                logger.warning("idempotency store failed before the push: %r", error)
                raise ApiError(503, f"the idempotency store failed; the job was not accepted, "
                                    f"retry: {_one_line(error)}",
                               {"Retry-After": str(RETRY_AFTER_THROTTLED)}) from None
            # Accepted: only its record failed. A retry finds the dedup claim (same job id).
            logger.warning("accepted under Idempotency-Key %r; its idempotency record failed: "
                           "%r", key, error)
            return done[0], False
        return answer, not done

    # -- batches ------------------------------------------------------------------------------
    def _push_batch_once(self, channel: ApiChannel, batch: BatchRequest, key: str
                         ) -> tuple[tuple[int, list[dict[str, Any]]], bool]:
        """A batch under an Idempotency-Key: ((status, results), whether a replay). Its answer
        is kept (and replayed) once no job of it is left to retry (each is 202 or 400); a batch
        with a job to retry (429) keeps no answer, and its retry under the key sends only what
        was not sent (every job's id is derived from key and index, pushed with dedup on)."""
        done: list[tuple[int, list[dict[str, Any]]]] = []

        def push(request: dict[str, Any]) -> dict[str, Any]:
            done.append(self._push_batch(channel, batch, key))
            status, results = done[0]
            if any(result["status"] in RETRY_STATUSES for result in results):
                raise _Unsettled()  # Powertools deletes the in-progress record: retry may finish
            return {"status": status, "jobs": results}

        try:
            answer, replayed = self._once(channel, key, {"key": key, "batch": batch.model_dump(
                mode="json")}, push, done)
        except _Unsettled:
            return done[0], False
        if isinstance(answer, tuple):  # the batch ran; only its record failed
            return answer, False
        return (int(answer["status"]), list(answer["jobs"])), replayed

    def _push_batch(self, channel: ApiChannel, batch: BatchRequest, key: str | None
                    ) -> tuple[int, list[dict[str, Any]]]:
        """Push the valid jobs of a batch with `push_many`; (status, one result per job).
        key: the batch's Idempotency-Key (each job's id derived from it and its index, dedup
        on); without one, a job's id is the API's own (on an ordered channel the producer's,
        from its deduplication id)."""
        results: list[dict[str, Any]] = [{"index": i} for i in range(len(batch.jobs))]
        ids: list[str | None] = [
            job_id_for_key(channel.name, f"{key}\nbatch\n{index}") if key is not None
            else None if channel.ordered else str(uuid.uuid4())
            for index in range(len(batch.jobs))]
        self._note(ids={job_id: index for index, job_id in enumerate(ids) if job_id},
                   results=results)
        items: list[PushItem] = []
        positions: list[int] = []
        for index, raw in enumerate(batch.jobs):
            try:
                job = JobRequest.model_validate(raw)
                # its own due time or dependencies: a push of its own (push_many's are per call)
                if _timing(job) or job.depends_on:
                    accepted = self._push(channel, job, ids[index], dedup=key is not None)
                    results[index].update(
                        status=202, job_id=accepted["job_id"],
                        scheduled=accepted["status"] == "scheduled",
                        **{k: v for k, v in accepted.items() if k == "due_at"})
                    continue
                items.append(_item(job, ids[index], dedup=key is not None))
                positions.append(index)
            except ValidationError as error:
                results[index].update(status=400, error=describe_errors(error.errors()))
            except ApiError as error:
                results[index].update(status=error.status, error=error.message)
        if items:
            producer = self._producer(channel)
            outcome = _refusing(lambda: producer.push_many(items))
            self._flush_status(producer)
            for position, job_id in enumerate(outcome.message_ids):
                if job_id is not None:
                    results[positions[position]].update(status=202, job_id=job_id)
            for failure in outcome.failures:
                if failure.code == DeadlinePassed.__name__:  # out of time, not a bad job
                    state = self.guard.current()
                    late = _deadline_error(state) if state is not None else None
                    results[positions[failure.index]].update(
                        status=503, error=late.message if late else failure.reason)
                    continue
                status = 429 if failure.code in RETRYABLE_CODES else 400
                results[positions[failure.index]].update(status=status, error=failure.reason)
        statuses = {result["status"] for result in results}
        if statuses == {202}:
            return 202, results
        if 202 in statuses:
            return 207, results  # some accepted: each job's own status says which
        return (503 if 503 in statuses else 429 if 429 in statuses else 400), results

    # -- status -------------------------------------------------------------------------------
    def _timeline(self, job_id: str) -> dict[str, Any]:
        tracked = {name for name, channel in self.channels.items() if channel.track_status}
        if not tracked:
            raise ApiError(404, "no channel of this API tracks status")
        with self._lock:
            if self._status is None:
                self._status = StatusStore(self.clients, self.settings)
            store = self._status
        try:
            found = store.timeline(job_id)
        except ChannelNotFound:  # no status table yet: nothing was recorded
            found = []
        # An exchange's records name its channels ('exchange.queue'): its consumers' records.
        served = {r.channel: name for r in found for name in tracked
                  if r.channel == name or (self.channels[name].exchange
                                           and r.channel.startswith(f"{name}."))}
        records = [r for r in found if r.channel in served]
        reader = self._reader_of()
        if not records:
            # A job held until its dependencies are final has no record before its release
            held = reader.held(job_id)
            if held is None or held.channel not in tracked:
                raise ApiError(404, f"no job {job_id!r} on a channel that tracks status")
            return {"job_id": job_id, "channel": held.channel, "status": held.state.value,
                    **reader.job(job_id), "events": []}
        # Whether progress is recorded is the channel's fact (its ChannelSpec's track_status, on
        # its queues): a channel whose consumers do not track answers its last known record as
        # such, never as current (`messenger.jobs.status.progress_answer`).
        channel = self.channels[served[records[0].channel]]
        return {"job_id": job_id, "channel": records[0].channel, "status": records[-1].event.value,
                **progress_answer(records, self._declared(channel), channel.name),
                **reader.job(job_id),
                "events": [_event(record) for record in records]}

    def _reader_of(self) -> JobReader:
        with self._lock:
            if self._reader is None:
                self._reader = JobReader(self.clients, self.settings)
            return self._reader

    def _declared(self, channel: ApiChannel) -> bool | None:
        """The channel's own declaration of track_status, read from its queues' tag. Where no
        queue tells (untagged: made before the tag existed; or the API's role may not read
        tags), the API's configuration stands in: a deployed API's MESSENGER_API_CHANNELS is
        written by the CDK from the same ChannelSpec."""
        with self._lock:
            if self._declarations is None:
                self._declarations = TrackingDeclarations(self.clients, self.settings)
            declarations = self._declarations
        if channel.exchange:
            answers = set(declarations.of_exchange(channel.name, channel.ordered).values())
            declared = answers.pop() if len(answers) == 1 else None
        else:
            declared = declarations.of_channel(ChannelSpec(
                channel.name, ordered=channel.ordered, namespace=self.settings.namespace,
                priorities=channel.priorities, default_priority=channel.default_priority))
        return channel.track_status if declared is None else declared

    # -- parts --------------------------------------------------------------------------------
    def _producer(self, channel: ApiChannel) -> Any:
        with self._lock:
            producer = self._producers.get(channel.name)
            if producer is None:
                cls = channel.producer_class(self.idempotency_window)
                producer = self._producers[channel.name] = cls(self.settings, self.clients)
            return producer

    def _store(self, channel: ApiChannel) -> Any:
        """The channel's idempotency records (its own store: Powertools keeps the key prefix
        on the store)."""
        from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

        table = idempotency_table_name(self.settings.namespace)
        with self._lock:
            if not self._table_ready:
                ensure_table(self.clients, self.settings, table, "idempotency", "id")
                self._table_ready = True
            store = self._stores.get(channel.name)
            if store is None:
                store = self._stores[channel.name] = DynamoDBPersistenceLayer(
                    table_name=table, key_attr="id", expiry_attr=EXPIRES_AT,
                    boto3_client=self.clients.client("dynamodb"))
            return store

    def _route_started(self) -> None:
        """The route has what it needs of the router's event: other requests may route now."""
        if getattr(self._holding, "lock", False):
            self._holding.lock = False
            self._routing.release()

    def _note(self, **notes: Any) -> None:
        """Tell a late answer (`_late_answer`) about the request: its route, channel, job ids."""
        state = self.guard.current()
        if state is not None:
            with state.lock:
                state.notes.update(notes)

    @staticmethod
    def _flush_status(producer: Any) -> None:
        """Write the QUEUED records now (a Lambda may freeze before the writer thread runs;
        a status failure is logged by the store, never a failed push)."""
        if producer.status is not None:
            try:
                producer.status.flush()
            except Exception:  # the job is accepted whatever happens to its record
                logger.exception("status records not written")

    @staticmethod
    def _location(app: APIGatewayRestResolver, job_id: str) -> str:
        """`/jobs/{id}` under the API's base path (the stage, as the client called it)."""
        event = app.current_event
        full = str(event.request_context.path or event.path)
        base = full[: -len(event.path)] if full.endswith(event.path) else ""
        return f"{base}/jobs/{job_id}"


def _item(job: JobRequest, message_id: str | None, dedup: bool | None = None) -> PushItem:
    if dedup is None:
        dedup = True if message_id is not None else None
    return PushItem(job.body, job.routing_key, group_id=job.group_id, priority=job.priority,
                    message_id=message_id, max_attempts=job.max_attempts, dedup=dedup or None)


def _timing(job: JobRequest) -> dict[str, Any]:
    """push's `at=` / `delay=` of a job ({} when it runs now); ApiError when it gives both."""
    if job.at is not None and job.delay_seconds:
        raise ApiError(400, "at, delay_seconds: give one of them, not both (at: an RFC 3339 "
                            "time with its zone; delay_seconds: seconds from now)")
    if job.at is not None:
        return {"at": job.at}
    if job.delay_seconds:
        return {"delay": job.delay_seconds}
    return {}


def _dependencies(job: JobRequest) -> dict[str, Any]:
    """push's `depends_on=` / `on_dependency_failure=` of a job ({} when it waits for none)."""
    if not job.depends_on:
        return {}
    return {"depends_on": list(job.depends_on),
            "on_dependency_failure": job.on_dependency_failure or "cancel"}


def _accepted(pushed: Any) -> dict[str, str]:
    """What a 202 says of a pushed job: its id, 'scheduled' (a one-time schedule holds it until
    `due_at`) or 'accepted' (in its queue; `due_at` when SQS's DelaySeconds hides it till then)."""
    answer = {"job_id": str(pushed), "status": "scheduled" if pushed.scheduled else "accepted"}
    if pushed.due is not None:
        answer["due_at"] = pushed.due.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return answer


def _refusing(call: Callable[[], Any]) -> Any:
    """Run a producer call; what it refuses becomes the ApiError a client can act on."""
    try:
        return call()
    except PayloadTooLarge as error:
        raise ApiError(413, str(error)) from None
    except InvalidMessage as error:  # invalid priority, routing key, body for the model, ...
        raise ApiError(400, str(error)) from None
    except RetryBudgetExhausted as error:
        raise ApiError(429, f"throttled: {error}; retry later",
                       {"Retry-After": str(RETRY_AFTER_THROTTLED)}) from None
    except ChannelNotFound as error:
        raise ApiError(503, f"the channel is not deployed: {error}") from None


def _checked_envelope(event: dict[str, Any]) -> dict[str, Any]:
    """The event to route, after what API Gateway checks in front of the function: the body's
    size, its media type (case-insensitive, RFC 9110: `APPLICATION/JSON; charset=UTF-8` is
    JSON; the header is handed on in lower case, as the router compares it) and its shape (a
    route takes one JSON object: an array is a 400 naming the object it expects)."""
    if event.get("httpMethod") != "POST":
        return event
    body = event.get("body") or ""
    raw = body.encode("utf-8") if isinstance(body, str) else body
    if len(raw) > MAX_REQUEST_BYTES:
        raise ApiError(413, f"request body above {MAX_REQUEST_BYTES} bytes (Lambda's 6 MB "
                            f"payload limit); bodies above 256 KiB go to S3 by themselves")
    headers = dict(event.get("headers") or {})
    names = [name for name in headers if name.lower() == "content-type"]
    value = str(headers[names[-1]]) if names else ""
    media, _, parameters = value.partition(";")
    media = media.strip().lower()
    if media != JSON:
        raise ApiError(415, f"Content-Type must be {JSON}, got {media or 'none'!r}")
    charset = re.search(r"charset\s*=\s*\"?([^\s;\"]+)", parameters, re.IGNORECASE)
    if charset and charset.group(1).lower() not in ("utf-8", "utf8"):
        raise ApiError(415, f"Content-Type: the charset of {JSON} is utf-8, got "
                            f"{charset.group(1)!r}")
    if event.get("isBase64Encoded") and isinstance(body, str):
        try:
            raw = base64.b64decode(body)
        except ValueError:
            raw = b""
    if raw.lstrip()[:1] == b"[":
        path = str(event.get("path") or "")
        expected = ('{"jobs": [{"body": ...}, ...]}, one object holding the list'
                    if path.endswith("/batch") else
                    '{"body": ...}, one job (several: {"jobs": [...]} to '
                    '/channels/{channel}/jobs/batch)')
        raise ApiError(400, f"request body: a JSON object {expected}; got a JSON array")
    for name in names:
        del headers[name]
    headers["content-type"] = JSON + (f";{parameters.lower()}" if parameters else "")
    multi = {name: values for name, values in (event.get("multiValueHeaders") or {}).items()
             if name.lower() != "content-type"}
    multi["content-type"] = [headers["content-type"]]
    return {**event, "headers": headers, "multiValueHeaders": multi}


def _deadline_error(state: RequestState) -> ApiError:
    """The 503 of a request whose deadline passed before its job was sent."""
    skipped = f" ({', '.join(sorted(set(state.refused)))} not made)" if state.refused else ""
    return ApiError(503, f"the job was not accepted: AWS did not answer within the request's "
                         f"deadline{skipped}; nothing was sent, retry",
                    {"Retry-After": str(RETRY_AFTER_THROTTLED)})


def _late_answer(state: RequestState, event: Mapping[str, Any], failed: bool
                 ) -> dict[str, Any]:
    """The answer of a request whose route did not answer: its deadline passed (`failed`
    False) or it raised. From what its sends did: a job SQS (SNS, Scheduler) accepted is a 202
    (never a 5xx); a job not sent is a 503 with Retry-After (500 for a failure that was not
    the deadline's); a job whose send did not answer in time is a 503 that says it may have
    been accepted (a retry with the same Idempotency-Key keeps its id: it runs once)."""
    with state.lock:
        notes, accepted = dict(state.notes), dict(state.accepted)
        unsure = state.sends_in_flight > 0 or state.unconfirmed
        refused = bool(state.refused)
    retry = {"Retry-After": str(RETRY_AFTER_THROTTLED)}
    unknown = ApiError(503, "SQS did not confirm the job within the request's deadline: it may "
                            "have been accepted; retry with the same Idempotency-Key (the job "
                            "keeps its id and runs once)", retry)
    if not failed or refused:
        not_sent = _deadline_error(state)
    else:
        not_sent = ApiError(500, "internal error: the request was not accepted")
    channel, base = notes.get("channel"), str(notes.get("base") or "/jobs/")
    if notes.get("route") == "batch":
        results: list[dict[str, Any]] = [dict(r) for r in notes.get("results") or []]
        indexes = {job_id: index for job_id, index in (notes.get("ids") or {}).items()}
        unmapped = [job_id for job_id in accepted if job_id not in indexes]
        for index, result in enumerate(results):
            job_id = next((j for j, i in indexes.items() if i == index and j in accepted), None)
            if job_id is not None:
                result.update(status=202, job_id=job_id, location=f"{base}{job_id}",
                              scheduled=accepted[job_id])
                result.pop("error", None)
            elif "status" not in result:
                error = unknown if (unsure or unmapped) else not_sent
                result.update(status=error.status, error=error.message)
        statuses = {result.get("status") for result in results}
        status = 202 if statuses == {202} else 207 if 202 in statuses else (
            unknown.status if unsure else not_sent.status)
        headers = {"Content-Type": JSON, **({} if status == 202 else retry)}
        return {"statusCode": status, "headers": headers, "isBase64Encoded": False,
                "body": json.dumps(_batch_answer(status, channel, results))}
    if accepted:
        job_id, scheduled = next(iter(accepted.items()))
        body = {"job_id": job_id, "channel": channel,
                "status": "scheduled" if scheduled else "accepted"}
        return {"statusCode": 202, "isBase64Encoded": False, "body": json.dumps(body),
                "headers": {"Content-Type": JSON, "Location": f"{base}{job_id}"}}
    return _error_response(unknown if unsure else not_sent)


def _batch_answer(status: int, channel: str | None, results: list[dict[str, Any]]
                  ) -> dict[str, Any]:
    """A batch's answer: each job's result; a batch of which no job was accepted also carries
    the `error` line every error answer has (its jobs' errors, by index)."""
    answer: dict[str, Any] = {"channel": channel, "jobs": results}
    if status >= 400:
        line = "; ".join(f"jobs.{r.get('index')}: {r.get('error')}" for r in results
                         if "error" in r)
        answer = {"error": f"no job of the batch was accepted: {line}"[:2000], **answer}
    return answer


def _shaped(response: dict[str, Any]) -> dict[str, Any]:
    """Every error answer is `{"error": "<one line>"}`, also one the router made itself."""
    if int(response.get("statusCode") or 200) < 400:
        return response
    try:
        body = json.loads(response.get("body") or "null")
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return response
    detail = body.get("detail") if isinstance(body, dict) else None
    message = describe_errors(detail) if isinstance(detail, list) and detail \
        else f"request refused ({response.get('statusCode')})"
    headers = {k: v for k, v in (response.get("headers") or {}).items()
               if k.lower() != "content-type"}
    return {**response, "body": json.dumps({"error": message}), "isBase64Encoded": False,
            "headers": {**headers, "Content-Type": JSON},
            "multiValueHeaders": {k: v for k, v in (response.get("multiValueHeaders")
                                                    or {}).items()
                                  if k.lower() != "content-type"}}


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300] or type(error).__name__


class _Unsettled(Exception):
    """A batch with a job to retry: its answer is not kept under its Idempotency-Key."""


def _remaining_millis(context: Any) -> int:
    """How long this request may stay in progress: the function's remaining time, at most
    API Gateway's 29 s."""
    limit = API_GATEWAY_TIMEOUT_SECONDS * 1000
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    return min(limit, int(remaining())) if callable(remaining) else limit


def _event(record: StatusRecord) -> dict[str, Any]:
    event: dict[str, Any] = {"event": record.event.value, "at": record.at}
    if record.consumer_id:
        event["consumer_id"] = record.consumer_id
    if record.receive_count:
        event["receive_count"] = record.receive_count
    if record.duration is not None:
        event["duration"] = record.duration
    if record.error:
        event["error"] = f"{record.error_class}: {record.error}" if record.error_class \
            else record.error
    return event


def _response(error: ApiError) -> Response:
    return Response(error.status, JSON, json.dumps({"error": error.message}),
                    headers=error.headers or None)


def _error_response(error: ApiError) -> dict[str, Any]:
    return {"statusCode": error.status, "headers": {"Content-Type": JSON, **error.headers},
            "body": json.dumps({"error": error.message}), "isBase64Encoded": False}
