"""Platform-owned SQS queues and SNS topics, found through the Resource Groups Tagging API.

One paginated `tag:GetResources` call returns up to 100 resources *with their tags*, so an
inventory of 1,000 queues costs about 15 calls instead of one ListQueueTags per queue. Pages
also end at 500 tags, so that count grows with the tags per resource; the queue alarm avoids
that: `list_queue_urls` (names only, 1,000 per ListQueues call) and `tags_by_arn` (the tags of
up to 100 named resources per call, never paginated) cost the same whatever the tags.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import boto3

from messenger.aws import ClientFactory
from messenger.channel import (
    DLQ_SUFFIX,
    FIFO_SUFFIX,
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
#: ListQueues returns at most 1,000 queue URLs per call.
QUEUES_PER_LIST = 1_000
#: GetResources takes at most 100 ARNs in ResourceARNList (and then returns them all at once).
ARNS_PER_TAG_CALL = 100


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


def list_queue_urls(clients: ClientFactory, prefix: str) -> list[str]:
    """The URL of every queue whose name starts with `prefix` ('' = every queue of the account
    and region): one ListQueues call per 1,000 queues."""
    sqs = clients.client("sqs")
    urls: list[str] = []
    token = ""
    while True:
        kwargs: dict[str, Any] = {"MaxResults": QUEUES_PER_LIST}
        if prefix:
            kwargs["QueueNamePrefix"] = prefix
        if token:
            kwargs["NextToken"] = token
        page = sqs.list_queues(**kwargs)
        urls.extend(str(url) for url in page.get("QueueUrls", []))
        token = page.get("NextToken") or ""
        if not token:
            return urls


def queue_arn(url: str, region: str) -> str:
    """The ARN of the queue at `url` (`https://sqs.<region>.amazonaws.com/<account>/<name>`)."""
    account, name = url.rstrip("/").split("/")[-2:]
    return f"arn:{_partition(region)}:sqs:{region}:{account}:{name}"


@functools.cache
def _partition(region: str) -> str:
    """'aws', 'aws-cn', ... (a boto3 session loads botocore's endpoint data: ~35 ms, once)."""
    return str(boto3.session.Session().get_partition_for_region(region))


def tags_by_arn(clients: ClientFactory, arns: Sequence[str]) -> dict[str, dict[str, str]]:
    """The tags of each resource of `arns` that has (or ever had) tags: one GetResources call
    per 100 ARNs, whatever their tags (a request naming its resources is not paginated)."""
    tagging = clients.client("resourcegroupstaggingapi")
    found: dict[str, dict[str, str]] = {}
    for start in range(0, len(arns), ARNS_PER_TAG_CALL):
        page = tagging.get_resources(ResourceARNList=list(arns[start : start + ARNS_PER_TAG_CALL]))
        while True:
            for item in page.get("ResourceTagMappingList", []):
                found[str(item["ResourceARN"])] = _tag_map(item.get("Tags", []))
            # AWS never pages such a request; stock moto does (by tags), so follow its token
            token = page.get("PaginationToken") or ""
            if not token:
                break
            page = tagging.get_resources(PaginationToken=token)
    return found


def role_by_name(names: Iterable[str]) -> dict[str, str | None]:
    """What each queue's name says of its role among `names`: 'dlq' for `<q>-dlq` when `<q>`
    is there too, 'queue' for `<q>` when `<q>-dlq` is there, else None (unknown: an orphaned
    DLQ, a channel whose name ends in '-dlq', a foreign queue). `.fifo` names likewise."""
    present = set(names)
    roles: dict[str, str | None] = {}
    for name in present:
        suffix = FIFO_SUFFIX if name.endswith(FIFO_SUFFIX) else ""
        base = name[: len(name) - len(suffix)]
        if base.endswith(DLQ_SUFFIX) and base[: -len(DLQ_SUFFIX)] + suffix in present:
            roles[name] = "dlq"
        elif base + DLQ_SUFFIX + suffix in present:
            roles[name] = "queue"
        else:
            roles[name] = None
    return roles
