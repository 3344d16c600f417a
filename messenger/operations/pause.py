"""Pause and resume a channel's consumers, Fargate and Lambda alike (`messenger pause`, the
dashboard's Pause button).

    report = pause(clients, settings, "orders", actor="ada@example.com")
    report = resume(clients, settings, "orders", actor="ada@example.com")

Pausing records each of the channel's queues as paused in the worker registry's table
(`messenger.jobs.controls.PauseRecords`: the pause's source of truth, which no deploy touches),
tags each of the channel's queues (every level of a prioritized channel) with
`messenger:paused` = `<who>@<UTC time>` (`messenger.jobs.controls.PauseMark`): a Fargate consumer
reads it once per heartbeat interval, stops receiving, finishes what it holds and stays PAUSED.
It also disables every Lambda event source mapping that reads those queues, so no Lambda
consumer is invoked (the AWS-native pause: no receives are spent). A deploy may undo the tag or
a mapping: the queue alarm puts them back from the records (`messenger.ops.pauses`). Resuming
removes the records and the tag and
enables those mappings again (every mapping of the channel's queues: one disabled by hand before
the pause is enabled too); its report names the pause it ended (`previous`, read from the tag
before it goes), so the dashboard's audit trail (`messenger.operations.audit`) keeps who paused
and who resumed. Messages wait in the queue meanwhile, within its retention.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from messenger.aws import ClientFactory
from messenger.jobs.controls import (
    TAG_PAUSED,
    PauseMark,
    PauseRecords,
    queue_mappings,
    read_pause,
)
from messenger.operations.queues import channel_queues, platform_queues
from messenger.settings import Settings

#: What SQS accepts in a tag value besides letters, digits and whitespace: `_ . : / = + - @`
#: ("Quotas related to queues", Amazon SQS Developer Guide); anything else is dropped from the
#: tag (the pause record keeps the name as given). `\w` is Unicode letters, digits and `_`.
TAG_VALUE_REFUSED = re.compile(r"[^\w\s.:/=+\-@]")


def tag_safe(value: str) -> str:
    """`value` with the characters SQS refuses in a tag value removed ('ada (cli)' ->
    'ada cli'): an actor such as `<login> (cli)` or `ada@example.com (unverified)`."""
    return TAG_VALUE_REFUSED.sub("", value)


@dataclass
class PauseReport:
    """What a pause or resume did: the queues (un)tagged, the Lambda mappings disabled or
    enabled (UUID), and what failed (one line each). previous: on resume, the pause it ended
    (the first queue's tag; None: the channel was not paused)."""

    channel: str
    paused: bool
    mark: PauseMark | None
    queues: list[str] = field(default_factory=list)
    mappings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    previous: PauseMark | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        what = str(self.mark) if self.paused and self.mark else "resumed" + (
            f" (was {self.previous})" if self.previous else " (was not paused)")
        text = (f"{self.channel}: {what}; {len(self.queues)} queue(s), "
                f"{len(self.mappings)} Lambda event source mapping(s) "
                f"{'disabled' if self.paused else 'enabled'}")
        return text + "".join(f"\n  failed: {e}" for e in self.errors)


def pause(clients: ClientFactory, settings: Settings, channel: str, actor: str) -> PauseReport:
    """Pause `channel`'s consumers (module doc); ChannelNotFound when it has no queue."""
    return _set(clients, settings, channel, PauseMark.now(actor))


def resume(clients: ClientFactory, settings: Settings, channel: str, actor: str) -> PauseReport:
    """Resume `channel`'s consumers (module doc); ChannelNotFound when it has no queue."""
    return _set(clients, settings, channel, None)


def paused_channels(clients: ClientFactory, settings: Settings) -> dict[str, PauseMark]:
    """The namespace's paused channels and who paused each (one tag query, as the snapshot's)."""
    return {q.channel: q.paused for q in platform_queues(clients, settings)
            if q.paused is not None}


def _set(clients: ClientFactory, settings: Settings, channel: str,
         mark: PauseMark | None) -> PauseReport:
    sqs = clients.client("sqs")
    records = PauseRecords(clients, settings)
    report = PauseReport(channel, paused=mark is not None, mark=mark)
    arns: list[str] = []
    for queue in channel_queues(clients, settings, channel):
        try:
            if mark is not None:
                records.put(queue.queue, channel, mark)
            else:
                records.delete(queue.queue)
        except Exception as error:  # the tag and the mappings still pause, until a deploy
            report.errors.append(f"pause record of {queue.queue} (a deploy may undo this "
                                 f"pause): {type(error).__name__}: {error}")
        try:
            url = sqs.get_queue_url(QueueName=queue.queue)["QueueUrl"]
            if mark is not None:
                sqs.tag_queue(QueueUrl=url, Tags={TAG_PAUSED: tag_safe(mark.tag_value())})
            else:
                report.previous = report.previous or read_pause(sqs, url)
                sqs.untag_queue(QueueUrl=url, TagKeys=[TAG_PAUSED])
            arns.append(sqs.get_queue_attributes(
                QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])
            report.queues.append(queue.queue)
        except Exception as error:
            report.errors.append(f"queue {queue.queue}: {type(error).__name__}: {error}")
    _switch_mappings(clients.client("lambda"), arns, enabled=mark is None, report=report)
    return report


def _switch_mappings(awslambda: Any, queue_arns: list[str], enabled: bool,
                     report: PauseReport) -> None:
    """Disable (pause) or enable (resume) the Lambda event source mappings reading the queues."""
    for arn in queue_arns:
        try:
            mappings = queue_mappings(awslambda, arn)
        except Exception as error:
            report.errors.append(f"listing the Lambda mappings of {arn}: "
                                 f"{type(error).__name__}: {error}")
            continue
        for mapping in mappings:
            try:
                awslambda.update_event_source_mapping(UUID=mapping["UUID"], Enabled=enabled)
                report.mappings.append(str(mapping["UUID"]))
            except Exception as error:
                report.errors.append(f"mapping {mapping['UUID']}: {type(error).__name__}: "
                                     f"{error}")
