"""`Producer` (single-consumer channel) and `MultiProducer` (exchange): the public push API.

    class WishListEventProducer(MultiProducer):
        channel = 'wishlist_events_exchange'
        ordered = True

    WishListEventProducer().push(body={...}, routing_key='MOBILE.APPLE')

Each subclass is a thread-safe singleton: `WishListEventProducer()` returns the same object
everywhere in the process. Infrastructure is checked once, at first use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import (
    MAX_BATCH_ENTRIES,
    SNS_MAX_MESSAGE_BYTES,
    SQS_MAX_MESSAGE_BYTES,
    ChannelSpec,
    queue_name_for,
)
from messenger.errors import (
    ChannelNotFound,
    InvalidChannelSpec,
    InvalidMessage,
    InvalidSettings,
    MessengerError,
    PayloadTooLarge,
    PublishFailed,
)
from messenger.message import EncodedMessage, Message
from messenger.offload import PayloadStore, pointer_attributes
from messenger.provision import Provisioner, is_missing_resource
from messenger.settings import Settings
from messenger.transport import EntryFailure, OutgoingMessage, QueueTarget, TopicTarget

logger = logging.getLogger("messenger.producer")

#: Largest body the offload bucket takes (the AWS extended clients' limit is 2 GB).
MAX_OFFLOADED_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class PushItem:
    """One message of `push_many`."""

    body: Any
    routing_key: str | None = None
    group_id: str | None = None
    dedup_id: str | None = None
    meta_headers: Mapping[str, str] | None = None


@dataclass(frozen=True)
class PushFailure:
    """An item `push_many` could not deliver: its index in the input and why."""

    index: int
    code: str
    reason: str


@dataclass
class PushManyResult:
    """message_ids[i] is the id of input item i, or None when it failed (see `failures`)."""

    message_ids: list[str | None] = field(default_factory=list)
    failures: list[PushFailure] = field(default_factory=list)
    offloaded: int = 0

    @property
    def published(self) -> int:
        return sum(1 for message_id in self.message_ids if message_id is not None)

    def raise_for_failures(self) -> None:
        if self.failures:
            first = self.failures[0]
            raise PublishFailed(
                f"{len(self.failures)} of {len(self.message_ids)} messages failed; first: "
                f"item {first.index}: {first.code}: {first.reason}"
            )


class _BaseProducer:
    channel: ClassVar[str] = ""
    ordered: ClassVar[bool] = False
    #: Offload bodies larger than this many bytes (None: the setting, default 256 KiB).
    offload_threshold: ClassVar[int | None] = None
    #: Message group of an ordered channel when a push names none (None: the channel name).
    group_id: ClassVar[str | None] = None
    max_payload_bytes: ClassVar[int] = MAX_OFFLOADED_BYTES

    _instances: ClassVar[dict[type, _BaseProducer]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls, settings: Settings | None = None, clients: ClientFactory | None = None) -> Any:
        if settings is not None or clients is not None:
            return super().__new__(cls)  # an explicitly configured, unshared instance
        with _BaseProducer._instances_lock:
            instance = _BaseProducer._instances.get(cls)
            if instance is None:
                instance = super().__new__(cls)
                instance._setup(None, None)
                _BaseProducer._instances[cls] = instance
            return instance

    def __init__(
        self, settings: Settings | None = None, clients: ClientFactory | None = None
    ) -> None:
        if settings is not None or clients is not None:
            self._setup(settings, clients)

    @classmethod
    def reset_instances(cls) -> None:
        """Forget the shared instances (e.g. after the environment changed in tests)."""
        with _BaseProducer._instances_lock:
            _BaseProducer._instances.clear()

    def _setup(self, settings: Settings | None, clients: ClientFactory | None) -> None:
        if not self.channel or not isinstance(self.channel, str):
            raise InvalidChannelSpec(f"{type(self).__name__}.channel must name a channel")
        if "." in self.channel:
            raise InvalidChannelSpec(
                f"{type(self).__name__}.channel {self.channel!r}: a producer names a queue or an "
                f"exchange, without '.<queue>' (consumers name 'exchange.queue')"
            )
        self.settings = settings or Settings.from_env()
        self.clients = clients or ClientFactory(self.settings.region)
        self.provisioner = Provisioner(self.clients, self.settings)
        self._lock = threading.Lock()
        self._target: QueueTarget | TopicTarget | None = None
        self._store: PayloadStore | None = None
        self.threshold = self._threshold()

    # -- to override ----------------------------------------------------------------------
    def meta_headers(self) -> dict[str, str]:
        """Headers added to every message (e.g. {'locale': current_locale()})."""
        return {}

    # -- channel specifics (subclasses) ---------------------------------------------------
    channel_limit: ClassVar[int]

    def _make_target(self) -> QueueTarget | TopicTarget:
        raise NotImplementedError

    # -- public API -----------------------------------------------------------------------
    def push(
        self,
        body: Any,
        routing_key: str | None = None,
        *,
        group_id: str | None = None,
        dedup_id: str | None = None,
        meta_headers: Mapping[str, str] | None = None,
    ) -> str:
        """Send one message; returns its message id. Raises InvalidMessage, PayloadTooLarge,
        ChannelNotFound (verify mode) or PublishFailed (transient errors past the budget)."""
        outgoing, message, _ = self._prepare(
            PushItem(body, routing_key, group_id, dedup_id, meta_headers)
        )
        self._with_target(lambda target: target.send(outgoing), "push")
        return message.message_id

    def push_many(self, items: Iterable[PushItem | Any]) -> PushManyResult:
        """Send many messages in batches of up to 10; items are PushItems or bare bodies.

        Entries that fail transiently are retried within the budget; what still fails (or was
        invalid) is reported in `failures`, never dropped silently: call `raise_for_failures()`
        to turn them into an exception.
        """
        items = [item if isinstance(item, PushItem) else PushItem(item) for item in items]
        result = PushManyResult(message_ids=[None] * len(items))
        prepared: list[tuple[int, OutgoingMessage, str]] = []
        for index, item in enumerate(items):
            try:
                outgoing, message, offloaded = self._prepare(item)
            except MessengerError as error:
                result.failures.append(PushFailure(index, type(error).__name__, str(error)))
                continue
            result.offloaded += offloaded
            prepared.append((index, outgoing, message.message_id))
        for batch in self._batches(prepared):
            self._send_batch(batch, result)
        result.failures.sort(key=lambda failure: failure.index)
        if result.failures:
            logger.warning(
                "push_many: %d of %d messages to %s failed",
                len(result.failures),
                len(items),
                self.channel,
            )
        return result

    # -- internals ------------------------------------------------------------------------
    def _threshold(self) -> int:
        threshold = self.offload_threshold or self.settings.offload_threshold
        if threshold > self.channel_limit:
            if self.offload_threshold is not None:
                raise InvalidSettings(
                    f"{type(self).__name__}.offload_threshold is {threshold} bytes; channel "
                    f"{self.channel!r} carries at most {self.channel_limit}"
                )
            threshold = self.channel_limit
        return threshold

    def _prepare(self, item: PushItem) -> tuple[OutgoingMessage, Message, int]:
        headers = {**self.meta_headers(), **(item.meta_headers or {})}
        message = Message(body=item.body, routing_key=item.routing_key, meta_headers=headers)
        encoded = message.encode()
        offloaded = 0
        if encoded.size > self.threshold:
            encoded = self._offload(encoded)
            offloaded = 1
        return OutgoingMessage(encoded, *self._fifo_fields(item)), message, offloaded

    def _fifo_fields(self, item: PushItem) -> tuple[str | None, str | None]:
        if not self.ordered:
            if item.group_id is not None or item.dedup_id is not None:
                raise InvalidMessage(
                    f"group_id and dedup_id apply to ordered channels only; {self.channel!r} "
                    f"is not ordered"
                )
            return None, None
        return item.group_id or self.group_id or self.channel, item.dedup_id

    def _offload(self, encoded: EncodedMessage) -> EncodedMessage:
        body_size = len(encoded.body.encode("utf-8"))
        if body_size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"message body is {body_size} bytes; the largest offloadable body is "
                f"{self.max_payload_bytes} bytes"
            )
        store = self._payload_store()
        pointer = call_with_budget(
            lambda: store.put(encoded.body), self.settings.retry_budget_seconds, "offload to S3"
        )
        attributes = {**encoded.attributes, **pointer_attributes(body_size)}
        offloaded = EncodedMessage(body=pointer.encode(), attributes=attributes)
        if offloaded.size > self.channel_limit:
            raise PayloadTooLarge(
                f"message attributes alone are {offloaded.size} bytes; channel {self.channel!r} "
                f"carries at most {self.channel_limit}"
            )
        return offloaded

    def _payload_store(self) -> PayloadStore:
        with self._lock:
            if self._store is None:
                bucket = self.provisioner.ensure_bucket()
                self._store = PayloadStore(
                    self.clients.client("s3"), bucket, self.provisioner.key_arn()
                )
            return self._store

    def _get_target(self, refresh: bool = False) -> QueueTarget | TopicTarget:
        with self._lock:
            if self._target is None or refresh:
                self._target = self._make_target()
            return self._target

    def _with_target(self, action: Any, what: str) -> Any:
        """Run `action(target)` within the retry budget; reprovision once if the target vanished."""
        budget = self.settings.retry_budget_seconds
        target = call_with_budget(self._get_target, budget, f"locating channel {self.channel!r}")
        try:
            return call_with_budget(lambda: action(target), budget, f"{what} to {self.channel!r}")
        except Exception as error:
            if not is_missing_resource(error):
                raise
            if self.settings.provisioning != "auto":
                raise ChannelNotFound(
                    f"channel {self.channel!r} disappeared ({error_code(error)}) and "
                    f"provisioning=verify: redeploy it"
                ) from error
            logger.warning("channel %s is missing; reprovisioning it", self.channel)
            target = call_with_budget(
                lambda: self._get_target(refresh=True), budget, f"reprovisioning {self.channel!r}"
            )
            return call_with_budget(lambda: action(target), budget, f"{what} to {self.channel!r}")

    def _batches(
        self, prepared: list[tuple[int, OutgoingMessage, str]]
    ) -> Iterable[list[tuple[int, OutgoingMessage, str]]]:
        batch: list[tuple[int, OutgoingMessage, str]] = []
        size = 0
        for entry in prepared:
            entry_size = entry[1].encoded.size
            if batch and (
                len(batch) == MAX_BATCH_ENTRIES or size + entry_size > self.channel_limit
            ):
                yield batch
                batch, size = [], 0
            batch.append(entry)
            size += entry_size
        if batch:
            yield batch

    def _send_batch(
        self, batch: list[tuple[int, OutgoingMessage, str]], result: PushManyResult
    ) -> None:
        pending = batch

        def send(target: QueueTarget | TopicTarget) -> list[EntryFailure]:
            return target.send_batch([outgoing for _, outgoing, _ in pending])

        deadline = time.monotonic() + self.settings.retry_budget_seconds
        attempt = 0
        while pending:
            try:
                failures = self._with_target(send, "push_many")
            except MessengerError as error:
                for index, _, _ in pending:
                    result.failures.append(PushFailure(index, type(error).__name__, str(error)))
                return
            failed = {failure.index: failure for failure in failures}
            retry = []
            for position, entry in enumerate(pending):
                failure = failed.get(position)
                if failure is None:
                    result.message_ids[entry[0]] = entry[2]
                elif failure.sender_fault or time.monotonic() >= deadline:
                    result.failures.append(PushFailure(entry[0], failure.code, failure.message))
                else:
                    retry.append(entry)
            pending = retry
            if pending:
                attempt += 1
                time.sleep(min(2.0, 0.05 * 2**attempt))


class Producer(_BaseProducer):
    """Pushes to a single-consumer channel: one SQS queue (created with its DLQ in auto mode)."""

    channel_limit = SQS_MAX_MESSAGE_BYTES

    def _make_target(self) -> QueueTarget:
        name = queue_name_for(self.channel, self.settings.namespace, self.ordered)
        queue = self.provisioner.find_queue(name)
        if queue is None:
            if self.settings.provisioning != "auto":
                raise ChannelNotFound(self.provisioner.describe_missing(f"queue {name!r}"))
            spec = ChannelSpec(
                name=self.channel, ordered=self.ordered, namespace=self.settings.namespace
            )
            queue = self.provisioner.ensure_channel(spec).queue
        return QueueTarget(self.clients.client("sqs"), queue.url)


class MultiProducer(_BaseProducer):
    """Publishes to an exchange: an SNS topic fanned out to its consumers' queues."""

    channel_limit = SNS_MAX_MESSAGE_BYTES

    def _make_target(self) -> TopicTarget:
        arn = self.provisioner.ensure_exchange(self.channel, self.ordered)
        return TopicTarget(self.clients.client("sns"), arn)
