"""`Producer` (single-consumer channel) and `MultiProducer` (exchange): the public push API.

    class WishListEventProducer(MultiProducer):
        channel = 'wishlist_events_exchange'
        ordered = True

    WishListEventProducer().push(body={...}, routing_key='MOBILE.APPLE')

Each subclass is a thread-safe singleton: `WishListEventProducer()` returns the same object
everywhere in the process. Infrastructure is checked once, at first use.
"""

from __future__ import annotations

import functools
import json

from messenger.aws import call_with_budget
from messenger.channel import (
    SNS_MAX_MESSAGE_BYTES,
    SQS_MAX_MESSAGE_BYTES,
    SQS_MAX_RECEIVE_COUNT,
    TAG_KEEP_RESULTS,
    declared_keep_results,
    queue_name_for,
    topic_name_for,
)
from messenger.errors import ChannelNotFound, InvalidSettings
from messenger.jobs.status import StatusStore, TrackingDeclarations, queue_tracking
from messenger.produce.base import MAX_OFFLOADED_BYTES, BaseProducer
from messenger.produce.push import PushedId, PushFailure, PushItem, PushManyResult
from messenger.produce.transport import QueueTarget, TopicTarget
from messenger.tracing import SNS_SYSTEM, SQS_SYSTEM

__all__ = ["MAX_OFFLOADED_BYTES", "BaseProducer", "MultiProducer", "Producer", "PushFailure",
           "PushItem", "PushManyResult", "PushedId"]


class Producer(BaseProducer):
    """Pushes to a single-consumer channel: one SQS queue (created with its DLQ in auto mode)."""

    channel_limit = SQS_MAX_MESSAGE_BYTES
    routes_priority_by_attribute = False
    messaging_system = SQS_SYSTEM

    @functools.cached_property
    def destination_name(self) -> str:
        return queue_name_for(self.channel, self.settings.namespace, self.ordered)

    def _make_target(self, level: str | None) -> QueueTarget:
        spec = self._spec(self.channel)
        if level is not None:
            spec = spec.level_spec(level)
        queue = self.provisioner.find_queue(spec.queue_name)
        if queue is None:
            if self.settings.provisioning != "auto":
                raise ChannelNotFound(
                    self.provisioner.describe_missing(f"queue {spec.queue_name!r}")
                )
            queue = self.provisioner.ensure_channel(spec).queue
        self._follow_channel(queue.url)
        return QueueTarget(self.clients.client("sqs", validate_params=False), queue.url)

    def _follow_channel(self, queue_url: str) -> None:
        """track_status None: record status when the channel declares it (its queue's tag),
        read once (under the target lock, before the first send)."""
        if self.track_status is not None or self.status is not None:
            return
        if queue_tracking(self.clients.client("sqs"), queue_url):
            self.status = StatusStore(self.clients, self.settings)
            self.scheduled.status = self.status

    @functools.cached_property
    def _result_declarations(self) -> TrackingDeclarations:
        return TrackingDeclarations(self.clients, self.settings, declared=declared_keep_results)

    def _check_keeps_results(self) -> None:
        declared = self._result_declarations.of_channel(self._spec(self.channel))
        if declared is True:
            return
        why = ("is deployed with keep_results=False" if declared is False else
               f"declares no keep_results (its queue is missing, carries no {TAG_KEEP_RESULTS} "
               f"tag, or its tags cannot be read)")
        raise InvalidSettings(
            f"keep_results: channel {self.channel!r} {why}; result() reads the jobs of a "
            f"channel whose ChannelSpec has keep_results=True")

    def _max_receives(self, level: str | None) -> int:
        """The queue's max_receives (its redrive policy's maxReceiveCount), read once per level
        and only for pushes that give `max_attempts`."""
        with self._lock:
            known = self._receives.get(level)
        if known is not None:
            return known
        budget = self.settings.retry_budget_seconds
        target = call_with_budget(
            lambda: self._get_target(level), budget, f"locating channel {self.channel!r}")
        assert isinstance(target, QueueTarget)
        attributes = call_with_budget(
            lambda: target.sqs.get_queue_attributes(
                QueueUrl=target.url, AttributeNames=["RedrivePolicy"]),
            budget, f"reading the redrive policy of {self.channel!r}",
        ).get("Attributes", {})
        redrive = json.loads(attributes.get("RedrivePolicy") or "{}")
        known = int(redrive.get("maxReceiveCount") or SQS_MAX_RECEIVE_COUNT)
        with self._lock:
            self._receives[level] = known
        return known


class MultiProducer(BaseProducer):
    """Publishes to an exchange: an SNS topic fanned out to its consumers' queues."""

    channel_limit = SNS_MAX_MESSAGE_BYTES
    routes_priority_by_attribute = True
    messaging_system = SNS_SYSTEM

    @functools.cached_property
    def destination_name(self) -> str:
        return topic_name_for(self.channel, self.settings.namespace, self.ordered)

    def _check_keeps_results(self) -> None:
        raise InvalidSettings(
            f"keep_results: {type(self).__name__} publishes to exchange {self.channel!r}, whose "
            f"jobs run once on each subscribed channel under one id: result() reads the jobs "
            f"of a queue channel (a Producer's) with keep_results=True")

    def _make_target(self, level: str | None) -> TopicTarget:
        arn = self.provisioner.ensure_exchange(self.channel, self.ordered)
        return TopicTarget(self.clients.client("sns", validate_params=False), arn)
