"""A channel's queues, resolved exactly from the tags the platform puts on them.

Every queue the platform provisions (`Provisioner`, or the CDK `Channel` construct) carries the
tags of its `ChannelSpec` (`ChannelSpec.resource_tags`): its channel, its role, and on a priority
level's queue the prioritized channel and the level. A channel's queues are the ones whose tags
name it, found with one Resource Groups Tagging query; a name prefix decides nothing (channels
`jobs`, with levels `jobs-high` and `jobs-low`, and `jobs-eu` live side by side).

    channel_queues(clients, settings, 'jobs')     # both levels of 'jobs', never 'jobs-eu'
    channel_queues(clients, settings, 'jobs-high')  # that level only

A queue provisioned before the level tags existed gets them on its next deploy (or the next
start of a producer or consumer in `auto` provisioning); until then it counts as a channel of
its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from messenger.aws import ClientFactory
from messenger.channel import (
    FIFO_SUFFIX,
    TAG_PRIORITY_CHANNEL,
    TAG_PRIORITY_LEVEL,
    declared_keep_results,
    physical_name,
)
from messenger.errors import ChannelNotFound
from messenger.jobs.controls import TAG_PAUSED, PauseMark
from messenger.ops.inventory import PlatformResource, list_platform_resources
from messenger.settings import Settings


@dataclass(frozen=True)
class ChannelQueue:
    """One queue of a channel, as its tags describe it.

    channel: the channel as its users name it ('orders', 'shop.audit'; 'jobs' for every level
    of the prioritized channel 'jobs'). queue_channel: the name of this queue's own spec (the
    level's 'jobs-high'; else the channel): what a requeue to this queue names. level: the
    priority level, None without priorities. queue: the physical queue name.
    """

    channel: str
    queue_channel: str
    queue: str
    level: str | None = None
    critical: bool = False
    #: Who paused the channel's consumers, and when (`messenger pause`; None: not paused).
    paused: PauseMark | None = None
    #: The channel keeps its jobs' results and final outcomes (its `keep_results` tag).
    keeps_results: bool = False

    @classmethod
    def from_resource(cls, resource: PlatformResource) -> ChannelQueue:
        """The queue (or DLQ) `resource` is, read from its tags."""
        own = resource.channel or resource.name
        return cls(
            channel=resource.tags.get(TAG_PRIORITY_CHANNEL) or own,
            queue_channel=own,
            queue=resource.name,
            level=resource.tags.get(TAG_PRIORITY_LEVEL) or None,
            critical=resource.channel_tags.critical,
            paused=PauseMark.parse(resource.tags.get(TAG_PAUSED)),
            keeps_results=declared_keep_results(resource.tags) is True,
        )

    @property
    def ordered(self) -> bool:
        return self.queue.endswith(FIFO_SUFFIX)


def platform_queues(clients: ClientFactory, settings: Settings) -> list[ChannelQueue]:
    """Every platform-owned queue of the namespace (DLQs not included), by physical name."""
    return [ChannelQueue.from_resource(r)
            for r in list_platform_resources(clients, settings.namespace, roles=("queue",))]


def channel_queues(clients: ClientFactory, settings: Settings, channel: str) -> list[ChannelQueue]:
    """The queues `channel` names, exactly: a channel's name gives every level's queue of a
    prioritized channel; a level's own name ('jobs-high'), a queue's physical name or a DLQ's
    name (with or without the namespace) gives that one queue. ChannelNotFound when none."""
    resources = list_platform_resources(clients, settings.namespace, roles=("queue", "dlq"))
    queues = [ChannelQueue.from_resource(r) for r in resources if r.role == "queue"]
    found = [q for q in queues if q.channel == channel]
    if not found:
        names = {channel, physical_name(channel, settings.namespace)}
        dlqs = {ChannelQueue.from_resource(r).queue_channel for r in resources
                if r.role == "dlq" and r.name in names}
        found = [q for q in queues
                 if q.queue_channel == channel or q.queue in names or q.queue_channel in dlqs]
    if not found:
        raise ChannelNotFound(
            f"no channel {channel!r} in namespace {settings.namespace or '(none)'!r} (no "
            f"platform-owned queue tagged with it)")
    return sorted(found, key=lambda q: q.queue)


def dead_letter_queue(attributes: Mapping[str, str]) -> str | None:
    """The name of the DLQ a queue's redrive policy names (from its attributes), or None."""
    try:
        redrive = json.loads(attributes.get("RedrivePolicy") or "{}")
    except ValueError:
        return None
    target = str(redrive.get("deadLetterTargetArn", "")) if isinstance(redrive, dict) else ""
    return target.rpartition(":")[2] or None

