"""Whether a job's last status record is its current state, for the readers of job status
(`messenger status`, the dashboard): the channel's `track_status` declaration, read from the
platform's tags (`messenger.channel.TAG_TRACK_STATUS`), given to
`messenger.jobs.status.progress_answer`. The HTTP API reads its served channels' queues instead
(`messenger.jobs.status.TrackingDeclarations`).
"""

from __future__ import annotations

import logging
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory
from messenger.channel import TAG_CHANNEL, TAG_PRIORITY_CHANNEL, declared_track_status
from messenger.jobs.status import StatusRecord, progress_answer
from messenger.ops.inventory import list_platform_resources
from messenger.settings import Settings

logger = logging.getLogger("messenger.status")


def declared_in_tags(clients: ClientFactory, settings: Settings, channel: str) -> bool | None:
    """The declaration of the channel a status record names, from the platform's tags (one
    Resource Groups Tagging query): its queue's, every level's of a prioritized channel, every
    subscribed channel's of an exchange (a MultiProducer's records name the exchange). True or
    False when they agree, None when they differ, none is found or the query fails."""
    try:
        resources = list_platform_resources(clients, settings.namespace, roles=("queue",))
    except (ClientError, BotoCoreError) as error:
        logger.info("channel tags not readable: %s", error)
        return None
    answers = {declared_track_status(r.tags) for r in resources
               if channel in (r.tags.get(TAG_CHANNEL), r.tags.get(TAG_PRIORITY_CHANNEL))
               or r.tags.get(TAG_CHANNEL, "").startswith(f"{channel}.")}
    return answers.pop() if len(answers) == 1 else None


def describe_progress(clients: ClientFactory, settings: Settings,
                      records: list[StatusRecord]) -> dict[str, Any]:
    """`progress_answer` of a timeline, the channel's declaration read from the platform's tags
    (`messenger status`, the dashboard); {} for an empty timeline."""
    if not records:
        return {}
    channel = records[-1].channel
    return progress_answer(records, declared_in_tags(clients, settings, channel), channel)
