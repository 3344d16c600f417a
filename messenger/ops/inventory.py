"""Platform-owned SQS queues and SNS topics, found through the Resource Groups Tagging API.

One paginated `tag:GetResources` call returns up to 100 resources *with their tags*, so an
inventory of 1,000 queues costs about 15 calls instead of one ListQueueTags per queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from messenger.aws import ClientFactory
from messenger.channel import (
    TAG_CHANNEL,
    TAG_MANAGED,
    TAG_NAMESPACE,
    TAG_ROLE,
    ChannelTags,
    parse_tags,
)

#: CloudFormation tags every resource of a stack with this; the ops tools never delete those.
CLOUDFORMATION_STACK_TAG = "aws:cloudformation:stack-name"
#: GetResources pages: at most 100 resources, and at most 500 tags (100 to 500 allowed). Both
#: are set because a page ends at whichever limit comes first (moto's default is 100 tags, i.e.
#: only ~14 of our resources per page).
RESOURCES_PER_PAGE = 100
TAGS_PER_PAGE = 500
ROLES = ("queue", "dlq", "topic")


@dataclass(frozen=True)
class PlatformResource:
    """A queue or topic carrying the platform's ownership tags."""

    arn: str
    tags: Mapping[str, str]

    @property
    def service(self) -> str:
        """'sqs' or 'sns'."""
        return self.arn.split(":")[2]

    @property
    def name(self) -> str:
        return self.arn.split(":")[5]

    @property
    def role(self) -> str:
        """'queue', 'dlq' or 'topic' (from the role tag; topics without one count as 'topic')."""
        return self.tags.get(TAG_ROLE) or ("topic" if self.service == "sns" else "queue")

    @property
    def channel(self) -> str:
        return self.tags.get(TAG_CHANNEL, "")

    @property
    def channel_tags(self) -> ChannelTags:
        return parse_tags(self.tags)

    @property
    def stack(self) -> str | None:
        """The CloudFormation stack that owns the resource, if any."""
        return self.tags.get(CLOUDFORMATION_STACK_TAG)

    def alarm_threshold(self, default: int, dlq_default: int = 0) -> int:
        """The depth above which the queue alarm reports this queue: a DLQ's own threshold
        (tag `messenger:dlq-alarm-threshold`, else `dlq_default`), a source queue's tag
        `messenger:alarm-threshold`, else `default`."""
        tags = self.channel_tags
        if self.role == "dlq":
            return dlq_default if tags.dlq_alarm_threshold is None else tags.dlq_alarm_threshold
        return default if tags.alarm_threshold is None else tags.alarm_threshold


def list_platform_resources(
    clients: ClientFactory,
    namespace: str,
    roles: Sequence[str] = ROLES,
    resource_types: Sequence[str] = ("sqs", "sns:topic"),
) -> list[PlatformResource]:
    """Every managed resource of `namespace` with one of `roles`, sorted by ARN.

    namespace: '' selects resources without a namespace tag (each stage cleans only its own).
    roles: subset of 'queue', 'dlq', 'topic'. resource_types: Tagging API type filters.
    """
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ValueError(f"roles {unknown} are not among {', '.join(ROLES)}")
    filters = [{"Key": TAG_MANAGED, "Values": ["true"]}]
    if namespace:
        filters.append({"Key": TAG_NAMESPACE, "Values": [namespace]})
    if set(roles) != set(ROLES):
        filters.append({"Key": TAG_ROLE, "Values": list(roles)})
    tagging = clients.client("resourcegroupstaggingapi")
    found = [
        PlatformResource(arn=str(item["ResourceARN"]), tags=_tag_map(item.get("Tags", [])))
        for page in _pages(tagging, filters, resource_types)
        for item in page.get("ResourceTagMappingList", [])
    ]
    return sorted(
        (r for r in found if namespace or TAG_NAMESPACE not in r.tags), key=lambda r: r.arn
    )


def _pages(tagging: Any, filters: list[dict[str, Any]], types: Sequence[str]) -> Iterable[Any]:
    token = ""
    while True:
        page = tagging.get_resources(
            TagFilters=filters,
            ResourceTypeFilters=list(types),
            ResourcesPerPage=RESOURCES_PER_PAGE,
            TagsPerPage=TAGS_PER_PAGE,
            PaginationToken=token,
        )
        yield page
        token = page.get("PaginationToken") or ""
        if not token:
            return


def _tag_map(tags: Iterable[Mapping[str, str]]) -> dict[str, str]:
    return {str(tag["Key"]): str(tag["Value"]) for tag in tags}
