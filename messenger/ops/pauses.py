"""Put back what a deploy undid of an operator's pause (run by the 15-minute queue alarm).

A pause (`messenger.operations.pause`) is a record per queue in the worker registry's table,
the queue's `messenger:paused` tag, and its Lambda event source mappings disabled. The record is
the source of truth: CloudFormation does not manage it. The tag and the mappings are
CloudFormation's resources, and a deploy can undo them: an update of a queue's `Tags` (a stack
tag added, a channel's tag changed) sets the template's tags, and a mapping that is replaced
(its queue replaced) is created enabled. For each record this puts the tag back when it is
missing or names another pause, and disables again each mapping of the queue that is enabled
or enabling. Fargate consumers read the record itself, so they stay paused meanwhile; a Lambda
consumer whose mapping a deploy re-enabled runs until the next pass (at most 15 minutes).

    reapplied = reapply_pauses(clients, settings)     # PauseReapplied: what it put back

Cost per run: one Query (none paused: nothing else); per paused queue, GetQueueUrl,
ListQueueTags, GetQueueAttributes (its ARN) and ListEventSourceMappings, plus one TagQueue or
UpdateEventSourceMapping per repair.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from messenger.aws import ClientFactory
from messenger.jobs.controls import TAG_PAUSED, PauseRecords, queue_mappings
from messenger.settings import Settings

#: Mapping states in which Lambda polls, or is about to.
RUNNING_MAPPING_STATES = frozenset({"Enabled", "Enabling", "Creating", "Updating"})


@dataclass
class PauseReapplied:
    """One pass: the paused queues checked, what was put back (one line each: which queue or
    mapping, whose pause) and what failed."""

    checked: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def reapply_pauses(clients: ClientFactory, settings: Settings) -> PauseReapplied:
    """Compare each paused queue's tag and Lambda mappings with its pause record, and put back
    what differs (module doc). Never raises for one queue: its error is reported."""
    result = PauseReapplied()
    try:
        records = PauseRecords(clients, settings).all()
    except Exception as error:
        result.errors.append(f"reading the pause records: {type(error).__name__}: {error}")
        return result
    sqs = clients.client("sqs")
    awslambda = clients.client("lambda")
    for record in records:
        whose = f"{record.channel or record.queue} {record.mark}"
        result.checked.append(record.queue)
        try:
            url = sqs.get_queue_url(QueueName=record.queue)["QueueUrl"]
            value = record.mark.tag_value()
            tags = sqs.list_queue_tags(QueueUrl=url).get("Tags") or {}
            if tags.get(TAG_PAUSED) != value:
                sqs.tag_queue(QueueUrl=url, Tags={TAG_PAUSED: value})
                result.repaired.append(f"{record.queue}: tag {TAG_PAUSED} put back ({whose})")
            arn = sqs.get_queue_attributes(
                QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            for mapping in queue_mappings(awslambda, arn):
                if mapping.get("State") in RUNNING_MAPPING_STATES:
                    awslambda.update_event_source_mapping(UUID=mapping["UUID"], Enabled=False)
                    result.repaired.append(f"{record.queue}: Lambda mapping {mapping['UUID']} "
                                           f"({mapping.get('State')}) disabled again ({whose})")
        except Exception as error:
            result.errors.append(f"{record.queue} ({whose}): {type(error).__name__}: {error}")
    return result
