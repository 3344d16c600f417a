"""`JobApi`: the HTTP job API, Powertools' REST resolver over the channels' producers.

    POST /channels/{channel}/jobs         one job: 202 + {"job_id": ...} + Location: /jobs/{id}
    POST /channels/{channel}/jobs/batch   up to 10 jobs: per-job results, like `push_many`
    GET  /jobs/{id}                       the job's status timeline (channels that track status)

Every job goes through the channel's own `Producer.push` / `push_many`, so offload, priorities,
routing keys, `max_attempts`, dedup and the QUEUED record are those of any Python producer.
An `Idempotency-Key` header makes the push run at most once per key and channel (Powertools'
idempotency utility on the idempotency table, the request's job as its payload): the same key and
job again answer the first job id without sending; another job under the key is 422; a request
still being accepted under the key is 409. The key also becomes the job's message id (a UUID
derived from channel and key) pushed with dedup on, so a push whose record was lost (a crash
between SQS and the record) is still not sent twice within the window.

What a status code promises: 2xx only for jobs SQS (or SNS) accepted; once a job is accepted,
never a 5xx (a failure to record the idempotency result after the send is logged, not answered).
"""

from __future__ import annotations

import json
import logging
import os
import threading
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
from messenger.api.requests import (
    MAX_IDEMPOTENCY_KEY_LENGTH,
    MAX_REQUEST_BYTES,
    BatchRequest,
    JobRequest,
    describe_errors,
)
from messenger.aws import ClientFactory
from messenger.channel import idempotency_table_name
from messenger.errors import (
    ChannelNotFound,
    InvalidMessage,
    InvalidSettings,
    PayloadTooLarge,
    RetryBudgetExhausted,
)
from messenger.jobs.status import StatusRecord, StatusStore
from messenger.jobs.tables import EXPIRES_AT, ensure_table
from messenger.produce.producer import PushItem
from messenger.settings import Settings

logger = logging.getLogger("messenger.api")

#: Seconds an Idempotency-Key is remembered (the IETF draft suggests at least 24 hours).
DEFAULT_IDEMPOTENCY_WINDOW = 86_400
#: API Gateway ends an integration after 29 s: a request is never held in progress longer.
API_GATEWAY_TIMEOUT_SECONDS = 29
#: Retry-After (seconds) of a 429 (throttled past the retry budget) and a 409 (in progress).
RETRY_AFTER_THROTTLED = 5
RETRY_AFTER_IN_PROGRESS = 2
#: Namespace of the job ids derived from Idempotency-Keys.
IDEMPOTENT_ID_NAMESPACE = uuid.UUID("5d1f6a36-5b0e-4d3b-9c43-41c2a6c1e7a1")
JSON = "application/json"
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
        self._lock = threading.Lock()
        self._table_ready = False
        self.app = self._routes()

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
        """Answer one REST proxy event. Size and content type are checked before routing, as
        API Gateway checks them in front of the function."""
        try:
            _check_envelope(event)
        except ApiError as error:
            return _error_response(error)
        try:
            return dict(self.app.resolve(event, context))
        except Exception:  # nothing was accepted: an accepted job never raises out of a route
            logger.exception("request failed")
            return _error_response(ApiError(500, "internal error: the request was not accepted"))

    # -- routes ------------------------------------------------------------------------------
    def _routes(self) -> APIGatewayRestResolver:
        app = APIGatewayRestResolver(enable_validation=True)

        @app.exception_handler(RequestValidationError)
        def invalid(error: RequestValidationError) -> Response:
            return _response(ApiError(400, describe_errors(error.errors())))

        @app.exception_handler(ApiError)
        def refused(error: ApiError) -> Response:
            return _response(error)

        @app.not_found
        def not_found(_: Exception) -> Response:
            return _response(ApiError(404, f"no route {app.current_event.http_method} "
                                           f"{app.current_event.path}"))

        @app.post("/channels/<channel>/jobs")
        def enqueue(
            channel: str, job: Annotated[JobRequest, Body()],
            idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        ):  # no return annotation: Powertools would validate the Response against it
            served = self._channel(channel)
            context = app.lambda_context
            if idempotency_key is None:
                accepted, replayed = self._push(served, job, None), False
            else:
                accepted, replayed = self._push_once(served, job, idempotency_key, context)
            headers = {"Location": self._location(app, accepted["job_id"])}
            if replayed:
                headers["Idempotent-Replayed"] = "true"
            body = {"job_id": accepted["job_id"], "channel": served.name, **accepted}
            return Response(202, JSON, json.dumps(body), headers=headers)

        @app.post("/channels/<channel>/jobs/batch")
        def enqueue_batch(channel: str, batch: Annotated[BatchRequest, Body()]):
            served = self._channel(channel)
            status, results = self._push_batch(served, batch)
            for result in results:
                if "job_id" in result:
                    result["location"] = self._location(app, result["job_id"])
            return Response(status, JSON, json.dumps({"channel": served.name, "jobs": results}))

        @app.get("/jobs/<job_id>")
        def job_status(job_id: str):
            return Response(200, JSON, json.dumps(self._timeline(job_id)))

        return app

    # -- one job ------------------------------------------------------------------------------
    def _channel(self, name: str) -> ApiChannel:
        served = self.channels.get(name)
        if served is None:
            raise ApiError(404, f"unknown channel {name!r}; this API serves "
                                f"{', '.join(sorted(self.channels))}")
        return served

    def _push(self, channel: ApiChannel, job: JobRequest, message_id: str | None
              ) -> dict[str, str]:
        """Push one job; what its answer says of it (`_accepted`). ApiError for what was not
        accepted."""
        item = _item(job, message_id)
        producer = self._producer(channel)
        pushed = _refusing(lambda: producer.push(
            item.body, item.routing_key, group_id=item.group_id, priority=item.priority,
            message_id=item.message_id, max_attempts=item.max_attempts, dedup=item.dedup,
            **_timing(job)))
        self._flush_status(producer)
        return _accepted(pushed)

    def _push_once(self, channel: ApiChannel, job: JobRequest, key: str, context: Any
                   ) -> tuple[dict[str, str], bool]:
        """Push under an Idempotency-Key; (the answer's job fields, whether it is a replay)."""
        from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig
        from aws_lambda_powertools.utilities.idempotency.base import IdempotencyHandler
        from aws_lambda_powertools.utilities.idempotency.exceptions import (
            IdempotencyAlreadyInProgressError,
            IdempotencyPersistenceLayerError,
            IdempotencyValidationError,
        )

        if not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH or not key.isprintable():
            raise ApiError(400, f"Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable "
                                f"characters")
        pushed: list[dict[str, str]] = []

        def push() -> dict[str, str]:
            pushed.append(self._push(channel, job, job_id_for_key(channel.name, key)))
            return pushed[0]

        remaining = _remaining_millis(context)
        config = IdempotencyConfig(
            event_key_jmespath="key", payload_validation_jmespath="job",
            raise_on_no_idempotency_key=True, expires_after_seconds=self.idempotency_window,
            lambda_context=_Deadline(remaining),  # type: ignore[arg-type]
        )
        runner = IdempotencyHandler(
            function=push, function_payload={"key": key, "job": job.model_dump(mode="json")},
            config=config, persistence_store=self._store(channel),
            key_prefix=f"http#{channel.name}", function_args=(), function_kwargs={},
        )
        try:
            answer = runner.handle()
        except IdempotencyValidationError:
            raise ApiError(422, "Idempotency-Key was used with another job on this channel; "
                                "use a new key for a new job") from None
        except IdempotencyAlreadyInProgressError:
            raise ApiError(409, "a request with this Idempotency-Key is still being accepted; "
                                "retry after it", {"Retry-After": str(RETRY_AFTER_IN_PROGRESS)}
                           ) from None
        except IdempotencyPersistenceLayerError as error:
            if not pushed:
                raise ApiError(503, f"the idempotency store failed; the job was not accepted: "
                                    f"{error}", {"Retry-After": str(RETRY_AFTER_THROTTLED)}
                               ) from None
            # Accepted: only its record failed. A retry finds the dedup claim (same job id).
            logger.warning("job %s accepted; its idempotency record failed: %s",
                           pushed[0]["job_id"], error)
            return pushed[0], False
        return {name: str(value) for name, value in answer.items()}, not pushed

    # -- batches ------------------------------------------------------------------------------
    def _push_batch(self, channel: ApiChannel, batch: BatchRequest
                    ) -> tuple[int, list[dict[str, Any]]]:
        """Push the valid jobs of a batch with `push_many`; (status, one result per job)."""
        results: list[dict[str, Any]] = [{"index": i} for i in range(len(batch.jobs))]
        items: list[PushItem] = []
        positions: list[int] = []
        for index, raw in enumerate(batch.jobs):
            try:
                job = JobRequest.model_validate(raw)
                if _timing(job):  # its own due time: a push of its own (push_many's is per call)
                    accepted = self._push(channel, job, None)
                    results[index].update(
                        status=202, job_id=accepted["job_id"],
                        scheduled=accepted["status"] == "scheduled",
                        **{k: v for k, v in accepted.items() if k == "due_at"})
                    continue
                items.append(_item(job, None))
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
                status = 429 if failure.code in RETRYABLE_CODES else 400
                results[positions[failure.index]].update(status=status, error=failure.reason)
        statuses = {result["status"] for result in results}
        if statuses == {202}:
            return 202, results
        if 202 in statuses:
            return 207, results  # some accepted: each job's own status says which
        return (429 if 429 in statuses else 400), results

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
        records = [r for r in found if r.channel in tracked]
        if not records:
            raise ApiError(404, f"no job {job_id!r} on a channel that tracks status")
        return {"job_id": job_id, "channel": records[0].channel, "status": records[-1].event.value,
                "events": [_event(record) for record in records]}

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


def _item(job: JobRequest, message_id: str | None) -> PushItem:
    return PushItem(job.body, job.routing_key, group_id=job.group_id, priority=job.priority,
                    message_id=message_id, max_attempts=job.max_attempts,
                    dedup=True if message_id is not None else None)


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


def _check_envelope(event: Mapping[str, Any]) -> None:
    if event.get("httpMethod") != "POST":
        return
    body = event.get("body") or ""
    if len(body.encode("utf-8") if isinstance(body, str) else body) > MAX_REQUEST_BYTES:
        raise ApiError(413, f"request body above {MAX_REQUEST_BYTES} bytes (Lambda's 6 MB "
                            f"payload limit); bodies above 256 KiB go to S3 by themselves")
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
    content_type = (headers.get("content-type") or "").split(";")[0].strip().lower()
    if content_type != JSON:
        raise ApiError(415, f"Content-Type must be {JSON}, got {content_type or 'none'!r}")


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
