"""`ChannelSpec`: the one model of a channel, used by the runtime provisioner and the CDK.

A channel name is either `<queue>` (single consumer: one SQS queue) or `<exchange>.<queue>`
(multi consumer: SNS topic `<exchange>` fanned out to the SQS queue `<queue>`). A producer of an
exchange names only `<exchange>`. Every queue has a dead-letter queue `<queue>-dlq`.
Physical names carry an optional namespace prefix (`<namespace>-<name>`) and `.fifo` when ordered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from messenger.errors import InvalidChannelSpec

# SQS quotas (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-queues.html)
#: A queue name has at most 80 characters, `.fifo` included.
SQS_MAX_NAME_LENGTH = 80
#: DelaySeconds ranges from 0 to 15 minutes.
SQS_MAX_DELAY_SECONDS = 900
#: VisibilityTimeout ranges from 0 to 12 hours.
SQS_MAX_VISIBILITY_TIMEOUT = 43_200
#: MessageRetentionPeriod ranges from 60 seconds to 14 days.
SQS_MIN_RETENTION_SECONDS = 60
SQS_MAX_RETENTION_SECONDS = 1_209_600
#: maxReceiveCount of a redrive policy ranges from 1 to 1,000.
SQS_MAX_RECEIVE_COUNT = 1_000
#: An SQS message (body and attributes) is at most 1 MiB since 2025.
SQS_MAX_MESSAGE_BYTES = 1_048_576
#: An SQS message carries at most 10 message attributes (SNS passes on what SQS accepts).
SQS_MAX_MESSAGE_ATTRIBUTES = 10
#: A batch call carries at most 10 entries.
MAX_BATCH_ENTRIES = 10
# SNS quotas
#: A topic name has at most 256 characters, `.fifo` included.
SNS_MAX_NAME_LENGTH = 256
#: An SNS message (body and attributes) is at most 256 KiB.
SNS_MAX_MESSAGE_BYTES = 262_144
#: An SNS filter policy may hold at most 150 values in all.
SNS_MAX_FILTER_VALUES = 150

FIFO_SUFFIX = ".fifo"
DLQ_SUFFIX = "-dlq"
ROUTING_KEY_ATTRIBUTE = "routing_key"
#: Message attribute naming a message's priority level on prioritized exchanges.
PRIORITY_ATTRIBUTE = "priority"
#: A prioritized channel has 2 to 10 levels named like 'high', 'default', 'low'.
MAX_PRIORITY_LEVELS = 10
_LEVEL_NAME = re.compile(r"^[a-z0-9_]{1,16}$")
DEFAULT_RETENTION_SECONDS = SQS_MAX_RETENTION_SECONDS
DEFAULT_VISIBILITY_TIMEOUT = 60
DEFAULT_MAX_RECEIVES = 3

# Tags that mark a resource as owned by the platform; the ops Lambdas select resources by them.
TAG_MANAGED = "messenger:managed"
TAG_CHANNEL = "messenger:channel"
TAG_NAMESPACE = "messenger:namespace"
TAG_OWNER = "messenger:owner"
TAG_TEAM = "messenger:team"
TAG_ALARM_THRESHOLD = "messenger:alarm-threshold"
TAG_DLQ_ALARM_THRESHOLD = "messenger:dlq-alarm-threshold"
TAG_CRITICAL = "messenger:critical"
TAG_ROLE = "messenger:role"  # "queue", "dlq" or "topic"
#: On a priority level's queue and DLQ: the prioritized channel they belong to, and the level
#: (the operations tools resolve a channel's queues by these, never by name prefix).
TAG_PRIORITY_CHANNEL = "messenger:priority-channel"
TAG_PRIORITY_LEVEL = "messenger:priority-level"
#: On a channel's queue and DLQ: the channel's `track_status` ("true"/"false"), so that every
#: process (producers, consumers, the HTTP API, the dashboard, the tools) reads the one
#: declaration of the channel (`ChannelSpec.track_status`) from the channel itself.
TAG_TRACK_STATUS = "messenger:track-status"
#: On a channel's queue and DLQ: the channel's `keep_results` ("true"/"false"), read as
#: TAG_TRACK_STATUS is: producers (`Producer.result`), consumers, the HTTP API, the dashboard.
TAG_KEEP_RESULTS = "messenger:keep-results"
#: On a channel's queue: its flow-control declarations (absent: none), the deployed defaults
#: that `messenger limits set` overrides at run time (docs/flow-control.md):
#: `max_concurrency` ("N"), `rate_limit` and `tenant_rate_limit` ("N/s", "N/min", "N/h").
TAG_MAX_CONCURRENCY = "messenger:max-concurrency"
TAG_RATE_LIMIT = "messenger:rate-limit"
TAG_TENANT_RATE_LIMIT = "messenger:tenant-rate-limit"
#: Sid of the queue-policy statement letting an exchange's topic deliver to a channel's queue, and
#: of the one letting it dead-letter to the channel's DLQ (the subscription's RedrivePolicy).
ALLOW_TOPIC_SID = "AllowExchangeTopic"
ALLOW_TOPIC_DEAD_LETTERS_SID = "AllowExchangeTopicDeadLetters"

_NAME_PART = re.compile(r"^[A-Za-z0-9_-]+$")
FilterType = Literal["exact", "prefix", "exclude"]
FILTER_TYPES: tuple[str, ...] = ("exact", "prefix", "exclude")


def _check_part(what: str, value: str) -> None:
    if not value:
        raise InvalidChannelSpec(f"{what} must not be empty")
    if value.endswith(FIFO_SUFFIX):
        raise InvalidChannelSpec(
            f"{what} {value!r} must not end with '.fifo': set ordered=True instead"
        )
    if not _NAME_PART.match(value):
        raise InvalidChannelSpec(f"{what} {value!r} may contain only letters, digits, '-' and '_'")


def physical_name(name: str, namespace: str = "", ordered: bool = False) -> str:
    """The AWS resource name of a queue or topic: namespace prefix and `.fifo` when ordered."""
    base = f"{namespace}-{name}" if namespace else name
    return base + (FIFO_SUFFIX if ordered else "")


#: A namespace prefixes queue, topic, stack and S3 bucket names. Bucket names are lower case, so
#: the namespace is too: 'Prod'/'prod' or 'a_b'/'a-b' would otherwise share one bucket.
_NAMESPACE = re.compile(r"^[a-z](?:[a-z0-9]|-(?=[a-z0-9]))*$")
#: '<namespace>-messenger-offload-<12-digit account>-<region>' must fit S3's 63 characters
#: (regions have up to 14 characters, e.g. 'ap-southeast-5').
MAX_NAMESPACE_LENGTH = 16
#: S3 refuses bucket names starting with these.
_RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")


def validate_namespace(namespace: str) -> str:
    """Check a namespace prefix (may be empty); returns it unchanged.

    1-16 characters of lowercase letters, digits and single '-', starting with a letter and not
    ending with '-'. No normalisation: two namespaces are one only when they are equal."""
    if not namespace:
        return namespace
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace) \
            or len(namespace) > MAX_NAMESPACE_LENGTH:
        suggestion = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", str(namespace).lower()))
        suggestion = suggestion.strip("-")[:MAX_NAMESPACE_LENGTH].strip("-")
        raise InvalidChannelSpec(
            f"namespace {namespace!r} may contain only lowercase letters, digits and single "
            f"'-', starting with a letter, at most {MAX_NAMESPACE_LENGTH} characters (it "
            f"prefixes S3 bucket names, which are lower case: 'Prod' and 'prod', or 'a_b' and "
            f"'a-b', would share one bucket)"
            + (f"; e.g. {suggestion!r}" if suggestion and suggestion != namespace else "")
        )
    if f"{namespace}-".startswith(_RESERVED_BUCKET_PREFIXES):
        raise InvalidChannelSpec(
            f"namespace {namespace!r}: S3 bucket names may not start with "
            f"{', '.join(_RESERVED_BUCKET_PREFIXES)}; choose another namespace"
        )
    return namespace


# Platform resource names shared by the runtime defaults (Settings) and the CDK app.
def platform_key_alias(namespace: str = "") -> str:
    """The platform KMS key's alias: 'alias/<namespace->messenger'."""
    return f"alias/{namespace}-messenger" if namespace else "alias/messenger"


def status_table_name(namespace: str = "") -> str:
    """The message status table: '<namespace->messenger-status'."""
    return f"{namespace}-messenger-status" if namespace else "messenger-status"


def dedup_table_name(namespace: str = "") -> str:
    """The enqueue-dedup claims table: '<namespace->messenger-dedup'."""
    return f"{namespace}-messenger-dedup" if namespace else "messenger-dedup"


#: Key prefix of consumers' claims of jobs fired by the scheduler in the dedup table
#: (`messenger.jobs.fired`); producers' claims are '<channel>#<message id>', and no channel
#: name holds an '@'. The CDK grants consumers this prefix only.
FIRED_CLAIM_PREFIX = "fired@"


def workflows_table_name(namespace: str = "") -> str:
    """Held jobs (`depends_on`) and groups (`messenger.jobs.workflows`):
    '<namespace->messenger-workflows'."""
    return f"{namespace}-messenger-workflows" if namespace else "messenger-workflows"


def limits_table_name(namespace: str = "") -> str:
    """The flow-control store: token buckets, concurrency leases and run-time limits
    (`messenger.jobs.limits`): '<namespace->messenger-limits'."""
    return f"{namespace}-messenger-limits" if namespace else "messenger-limits"


def idempotency_table_name(namespace: str = "") -> str:
    """The idempotent handlers' records: '<namespace->messenger-idempotency'."""
    return f"{namespace}-messenger-idempotency" if namespace else "messenger-idempotency"


def workers_table_name(namespace: str = "") -> str:
    """The consumer-process registry: '<namespace->messenger-workers'."""
    return f"{namespace}-messenger-workers" if namespace else "messenger-workers"


def audit_table_name(namespace: str = "") -> str:
    """The dashboard's audit trail (`messenger.operations.audit`): '<namespace->messenger-audit'."""
    return f"{namespace}-messenger-audit" if namespace else "messenger-audit"


def lambda_consumer_prefix(namespace: str = "") -> str:
    """The start of every Lambda consumer function's name (`stacks.lambda_consumer`):
    '<namespace->messenger-consumer-'. The dashboard's pause may update only the event source
    mappings of functions so named."""
    return f"{namespace}-messenger-consumer-" if namespace else "messenger-consumer-"


def schedule_group_name(namespace: str = "") -> str:
    """The EventBridge Scheduler group of a namespace's scheduled jobs: '<namespace->messenger'."""
    return f"{namespace}-messenger" if namespace else "messenger"


def scheduler_role_name(namespace: str = "") -> str:
    """The IAM role EventBridge Scheduler assumes to send a namespace's scheduled jobs:
    '<namespace->messenger-scheduler'."""
    return f"{namespace}-messenger-scheduler" if namespace else "messenger-scheduler"


def schedule_dlq_name(namespace: str = "") -> str:
    """The standard SQS queue of the scheduled jobs Scheduler could not deliver:
    '<namespace->messenger-schedules-dlq'."""
    return f"{namespace}-messenger-schedules-dlq" if namespace else "messenger-schedules-dlq"


def offload_bucket_name(namespace: str, account_id: str, region: str) -> str:
    """The offload bucket: '<namespace->messenger-offload-<account>-<region>'. Bucket names are
    global: the region keeps one namespace in two regions (or accounts) apart."""
    prefix = f"{namespace}-" if namespace else ""
    return f"{prefix}messenger-offload-{account_id}-{region}"


@dataclass(frozen=True)
class MessageFilter:
    """Which routing keys a consumer's subscription receives.

    filter_type: 'exact' (any of the values), 'prefix' (starts with any of the values) or
    'exclude' (anything but the values). values: 1 to 150 non-empty strings.
    """

    filter_type: str
    values: tuple[str, ...]

    def __init__(self, filter_type: str, values: Any) -> None:
        if filter_type not in FILTER_TYPES:
            raise InvalidChannelSpec(
                f"message_filter.filter_type {filter_type!r} is not one of "
                f"{', '.join(FILTER_TYPES)}"
            )
        if isinstance(values, str) or not isinstance(values, (list, tuple)):
            raise InvalidChannelSpec("message_filter.values must be a list of strings")
        if not values:
            raise InvalidChannelSpec("message_filter.values must not be empty")
        if len(values) > SNS_MAX_FILTER_VALUES:
            raise InvalidChannelSpec(
                f"message_filter.values has {len(values)} values; SNS allows at most "
                f"{SNS_MAX_FILTER_VALUES}"
            )
        for value in values:
            if not isinstance(value, str) or not value:
                raise InvalidChannelSpec(
                    f"message_filter.values must be non-empty strings, got {value!r}"
                )
        object.__setattr__(self, "filter_type", filter_type)
        object.__setattr__(self, "values", tuple(values))

    def policy(self) -> dict[str, list[Any]]:
        """The SNS filter policy (message-attributes scope) on the routing key."""
        if self.filter_type == "exact":
            return {ROUTING_KEY_ATTRIBUTE: list(self.values)}
        if self.filter_type == "prefix":
            return {ROUTING_KEY_ATTRIBUTE: [{"prefix": v} for v in self.values]}
        return {ROUTING_KEY_ATTRIBUTE: [{"anything-but": list(self.values)}]}

    def matches(self, routing_key: str | None) -> bool:
        """Whether SNS would deliver a message with this routing key (no key never matches)."""
        if routing_key is None:
            return False
        if self.filter_type == "exact":
            return routing_key in self.values
        if self.filter_type == "prefix":
            return any(routing_key.startswith(v) for v in self.values)
        return routing_key not in self.values


def _check_flag(name: str, value: object) -> None:
    """A yes/no field must be a real bool: `ordered="false"` would otherwise read as true."""
    if not isinstance(value, bool):
        raise InvalidChannelSpec(f"{name} must be True or False, got {value!r}")


@dataclass(frozen=True)
class ChannelTags:
    """Ownership and alerting tags of a channel.

    owner/team: who to ask about it. alarm_threshold: queue depth above which the queue alarm
    reports it (None: the platform default). dlq_alarm_threshold: the same for the channel's
    dead-letter queues (None: the platform's DLQ default, 0 = any dead letter); the source's
    threshold never applies to a DLQ. critical: listed first and flagged in alerts.
    """

    owner: str = ""
    team: str = ""
    alarm_threshold: int | None = None
    critical: bool = False
    dlq_alarm_threshold: int | None = None

    def __post_init__(self) -> None:
        for field_name in ("owner", "team"):
            if not isinstance(getattr(self, field_name), str):
                raise InvalidChannelSpec(
                    f"tags.{field_name} must be a string, got {getattr(self, field_name)!r}"
                )
        _check_flag("tags.critical", self.critical)
        for field_name in ("alarm_threshold", "dlq_alarm_threshold"):
            value = getattr(self, field_name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise InvalidChannelSpec(
                    f"tags.{field_name} must be a whole number >= 0, got {value!r}"
                )


@dataclass(frozen=True)
class ChannelSpec:
    """One channel: its queue, its DLQ and, for `exchange.queue`, its topic and subscription.

    name: `queue` or `exchange.queue` (letters, digits, '-', '_'; no '.fifo').
    ordered: FIFO topic/queue/DLQ with content-based deduplication (default False).
    delay: seconds every message waits before it is visible, 0-900 (default 0).
    message_filter: routing-key filter of the subscription (exchanges only; default none).
    max_receives: receives before SQS moves a message to the DLQ, 1-1000 (default 3).
    retention_seconds: 60 s to 14 days (default 14 days), for queue and DLQ.
    visibility_timeout: seconds, 0-43200 (default 60).
    tags: ownership and alerting tags.
    namespace: physical name prefix (e.g. a stage), '' for none.
    priorities: priority levels, highest first (e.g. ('high', 'default', 'low')); each level is
        its own queue `<queue>-<level>` (+ DLQ) behind the channel name. () for none.
    default_priority: the level of a message pushed without one (default: 'default' when
        it is a level, else the lowest).
    track_status: record each message's lifecycle in the status table (default False).
    keep_results: store each job's handler return value (JSON) and final outcome with its
        status records, under the same expiry; `Producer.result(job_id)` reads it, and jobs can
        depend on it (`depends_on`, groups). Needs track_status (default False).
    max_concurrency: at most this many handlers of the channel run at once across all its
        consumers, 1-10,000 (None: no limit; docs/flow-control.md says where it holds).
    rate_limit: at most this many jobs (weighted: `Consumer.weight`) start per period across
        every consumer, "N/s", "N/min" or "N/h" (None: none). Changed at run time by
        `messenger limits set` without a deploy.
    tenant_rate_limit: the same per tenant: a fair queue's tenant key or a FIFO group
        (MessageGroupId), "N/s", "N/min" or "N/h" (None: none).
    priority_level: set on the per-level specs `level_specs()` returns; not set by users.
    """

    name: str
    ordered: bool = False
    delay: int = 0
    message_filter: MessageFilter | None = None
    max_receives: int = DEFAULT_MAX_RECEIVES
    retention_seconds: int = DEFAULT_RETENTION_SECONDS
    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT
    tags: ChannelTags = field(default_factory=ChannelTags)
    namespace: str = ""
    priorities: tuple[str, ...] = ()
    default_priority: str | None = None
    track_status: bool = False
    keep_results: bool = False
    max_concurrency: int | None = None
    rate_limit: str | None = None
    tenant_rate_limit: str | None = None
    priority_level: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise InvalidChannelSpec(f"name must be a string, got {self.name!r}")
        if self.name.endswith(FIFO_SUFFIX):
            raise InvalidChannelSpec(
                f"name {self.name!r} must not end with '.fifo': set ordered=True instead"
            )
        parts = self.name.split(".")
        if len(parts) > 2:
            raise InvalidChannelSpec(
                f"name {self.name!r} must be 'queue' or 'exchange.queue' (at most one '.')"
            )
        for what, part in zip(("exchange", "queue")[-len(parts) :], parts):
            _check_part(f"channel {what} name", part)
        validate_namespace(self.namespace)
        for attr, limit in (
            (self.queue_name, SQS_MAX_NAME_LENGTH),
            (self.dlq_name, SQS_MAX_NAME_LENGTH),
        ):
            if len(attr) > limit:
                raise InvalidChannelSpec(
                    f"queue name {attr!r} is {len(attr)} characters; SQS allows at most {limit}"
                )
        if self.topic_name is not None and len(self.topic_name) > SNS_MAX_NAME_LENGTH:
            raise InvalidChannelSpec(
                f"topic name {self.topic_name!r} is longer than {SNS_MAX_NAME_LENGTH} characters"
            )
        _check_range("delay", self.delay, 0, SQS_MAX_DELAY_SECONDS)
        _check_range("max_receives", self.max_receives, 1, SQS_MAX_RECEIVE_COUNT)
        _check_range(
            "retention_seconds",
            self.retention_seconds,
            SQS_MIN_RETENTION_SECONDS,
            SQS_MAX_RETENTION_SECONDS,
        )
        _check_range("visibility_timeout", self.visibility_timeout, 0, SQS_MAX_VISIBILITY_TIMEOUT)
        if self.message_filter is not None:
            if not isinstance(self.message_filter, MessageFilter):
                raise InvalidChannelSpec("message_filter must be a MessageFilter")
            if self.exchange is None:
                raise InvalidChannelSpec(
                    f"message_filter needs a multi-consumer channel 'exchange.queue'; "
                    f"{self.name!r} is a single queue"
                )
        if not isinstance(self.tags, ChannelTags):
            raise InvalidChannelSpec("tags must be a ChannelTags")
        _check_flag("ordered", self.ordered)
        _check_flag("track_status", self.track_status)
        _check_flag("keep_results", self.keep_results)
        if self.keep_results and not self.track_status:
            raise InvalidChannelSpec(
                "keep_results needs track_status=True: results are kept with the job's status "
                "records")
        if self.max_concurrency is not None:
            _check_range("max_concurrency", self.max_concurrency, 1, MAX_CONCURRENCY)
        for what in ("rate_limit", "tenant_rate_limit"):
            value = getattr(self, what)
            if value is not None:
                parse_rate(value, what)
        self._check_priorities()

    def _check_priorities(self) -> None:
        levels = self.priorities
        if not isinstance(levels, tuple):
            raise InvalidChannelSpec(f"priorities must be a tuple of level names, got {levels!r}")
        if levels:
            if self.priority_level is not None:
                raise InvalidChannelSpec("a level spec cannot declare priorities itself")
            if not 2 <= len(levels) <= MAX_PRIORITY_LEVELS:
                raise InvalidChannelSpec(
                    f"priorities must name 2 to {MAX_PRIORITY_LEVELS} levels, got {len(levels)}"
                )
            for level in levels:
                if not isinstance(level, str) or not _LEVEL_NAME.match(level):
                    raise InvalidChannelSpec(
                        f"priority level {level!r} must be 1-16 characters of a-z, 0-9, '_'"
                    )
            if len(set(levels)) != len(levels):
                raise InvalidChannelSpec(f"priorities {levels!r} name a level twice")
            if self.default_priority is not None and self.default_priority not in levels:
                raise InvalidChannelSpec(
                    f"default_priority {self.default_priority!r} is not one of {', '.join(levels)}"
                )
            self.level_specs()  # every level's queue name must fit too
        elif self.default_priority is not None and self.priority_level is None:
            raise InvalidChannelSpec("default_priority needs priorities")

    # -- priority levels ------------------------------------------------------------------
    @property
    def default_level(self) -> str | None:
        """The level of a message pushed without a priority (None: no priorities)."""
        return default_level(self.priorities, self.default_priority)

    def level_specs(self) -> list[ChannelSpec]:
        """One spec per priority level (highest first), or [self] without priorities."""
        if not self.priorities:
            return [self]
        prefix = f"{self.exchange}." if self.exchange else ""
        # A level spec remembers the channel's default level: its queue also takes messages
        # pushed without a priority.
        return [
            replace(
                self,
                name=f"{prefix}{self.queue}-{level}",
                priorities=(),
                default_priority=self.default_level,
                priority_level=level,
            )
            for level in self.priorities
        ]

    def level_spec(self, level: str) -> ChannelSpec:
        """The spec of one level; InvalidChannelSpec naming the levels for an unknown one."""
        for spec in self.level_specs():
            if spec.priority_level == level:
                return spec
        raise InvalidChannelSpec(
            f"priority {level!r} is not one of {', '.join(self.priorities) or '(no priorities)'}"
        )

    # -- naming ---------------------------------------------------------------------------
    @property
    def exchange(self) -> str | None:
        """The exchange (SNS topic) part of the name, or None for a single-consumer channel."""
        return self.name.split(".")[0] if "." in self.name else None

    @property
    def queue(self) -> str:
        """The logical queue part of the name."""
        return self.name.split(".")[-1]

    @property
    def queue_name(self) -> str:
        return physical_name(self.queue, self.namespace, self.ordered)

    @property
    def dlq_name(self) -> str:
        return physical_name(self.queue + DLQ_SUFFIX, self.namespace, self.ordered)

    @property
    def topic_name(self) -> str | None:
        if self.exchange is None:
            return None
        return physical_name(self.exchange, self.namespace, self.ordered)

    @property
    def max_message_bytes(self) -> int:
        """The largest message the channel carries: SNS's limit for exchanges, SQS's otherwise."""
        return SNS_MAX_MESSAGE_BYTES if self.exchange else SQS_MAX_MESSAGE_BYTES

    # -- resource attributes (shared by provisioner and CDK) ------------------------------
    def queue_attributes(self) -> dict[str, str]:
        """SQS attributes of the source queue, without RedrivePolicy and KmsMasterKeyId."""
        attributes = {
            "DelaySeconds": str(self.delay),
            "MessageRetentionPeriod": str(self.retention_seconds),
            "VisibilityTimeout": str(self.visibility_timeout),
            "ReceiveMessageWaitTimeSeconds": "20",
        }
        if self.ordered:
            attributes.update(FifoQueue="true", ContentBasedDeduplication="true")
        return attributes

    def dlq_attributes(self) -> dict[str, str]:
        """SQS attributes of the dead-letter queue (same FIFO-ness and retention as the queue)."""
        attributes = {"MessageRetentionPeriod": str(self.retention_seconds)}
        if self.ordered:
            attributes.update(FifoQueue="true", ContentBasedDeduplication="true")
        return attributes

    def redrive_policy(self, dlq_arn: str) -> dict[str, Any]:
        return {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": self.max_receives}

    def subscription_redrive_policy(self, dlq_arn: str) -> dict[str, str]:
        """The exchange subscription's RedrivePolicy: what SNS cannot deliver to the queue (a
        broken queue policy or key, a deleted queue) goes to the channel's DLQ after SNS's
        retries, instead of being dropped. The DLQ's policy must let the topic send."""
        return {"deadLetterTargetArn": dlq_arn}

    def topic_attributes(self) -> dict[str, str]:
        """SNS attributes of the exchange topic, without KmsMasterKeyId."""
        return topic_attributes(self.ordered)

    def topic_tags(self) -> dict[str, str]:
        """Tags of the exchange topic: the exchange's own, shared by all its channels."""
        if self.exchange is None:
            raise InvalidChannelSpec(f"{self.name!r} is a single queue: it has no topic")
        return exchange_tags(self.exchange, self.namespace)

    def filter_policy(self) -> dict[str, list[Any]] | None:
        """The subscription's filter policy (message-attributes scope), or None for all messages.

        A priority level's queue admits its level; the default level also admits messages
        without a priority attribute."""
        policy: dict[str, list[Any]] = self.message_filter.policy() if self.message_filter else {}
        if self.priority_level is not None:
            admitted: list[Any] = [self.priority_level]
            if self.priority_level == self.default_priority:
                # First: moto stops at a string rule when the attribute is absent (SNS does not
                # care about the order).
                admitted.insert(0, {"exists": False})
            policy[PRIORITY_ATTRIBUTE] = admitted
        return policy or None

    def filter_policy_json(self) -> str | None:
        policy = self.filter_policy()
        return json.dumps(policy, sort_keys=True) if policy is not None else None

    def resource_tags(self, role: str) -> dict[str, str]:
        """Tags of one of the channel's resources; role is 'queue', 'dlq' or 'topic'."""
        tags = {
            TAG_MANAGED: "true",
            TAG_CHANNEL: self.name,
            TAG_ROLE: role,
            TAG_CRITICAL: "true" if self.tags.critical else "false",
        }
        if self.namespace:
            tags[TAG_NAMESPACE] = self.namespace
        if self.priority_level is not None:
            tags[TAG_PRIORITY_CHANNEL] = self.name.removesuffix(f"-{self.priority_level}")
            tags[TAG_PRIORITY_LEVEL] = self.priority_level
        if role in ("queue", "dlq"):
            tags[TAG_TRACK_STATUS] = "true" if self.track_status else "false"
            tags[TAG_KEEP_RESULTS] = "true" if self.keep_results else "false"
        if role == "queue":
            if self.max_concurrency is not None:
                tags[TAG_MAX_CONCURRENCY] = str(self.max_concurrency)
            if self.rate_limit is not None:
                tags[TAG_RATE_LIMIT] = str(parse_rate(self.rate_limit))
            if self.tenant_rate_limit is not None:
                tags[TAG_TENANT_RATE_LIMIT] = str(parse_rate(self.tenant_rate_limit))
        if self.tags.owner:
            tags[TAG_OWNER] = self.tags.owner
        if self.tags.team:
            tags[TAG_TEAM] = self.tags.team
        if self.tags.alarm_threshold is not None:
            tags[TAG_ALARM_THRESHOLD] = str(self.tags.alarm_threshold)
        if self.tags.dlq_alarm_threshold is not None:
            tags[TAG_DLQ_ALARM_THRESHOLD] = str(self.tags.dlq_alarm_threshold)
        return tags

    def with_namespace(self, namespace: str) -> ChannelSpec:
        """The same channel in another namespace."""
        return replace(self, namespace=namespace)


def default_level(priorities: tuple[str, ...], default_priority: str | None) -> str | None:
    """The level a message without a priority goes to."""
    if not priorities:
        return None
    if default_priority is not None:
        return default_priority
    return "default" if "default" in priorities else priorities[-1]


def topic_attributes(ordered: bool) -> dict[str, str]:
    """SNS attributes of an exchange's topic, without KmsMasterKeyId."""
    return {"FifoTopic": "true", "ContentBasedDeduplication": "true"} if ordered else {}


def exchange_tags(exchange: str, namespace: str = "") -> dict[str, str]:
    """Tags of an exchange's topic (not one channel's: every channel of it shares the topic)."""
    tags = {TAG_MANAGED: "true", TAG_CHANNEL: exchange, TAG_ROLE: "topic"}
    if namespace:
        tags[TAG_NAMESPACE] = namespace
    return tags


def topic_name_for(exchange: str, namespace: str = "", ordered: bool = False) -> str:
    """The validated physical topic name of an exchange (what a MultiProducer publishes to)."""
    _check_part("exchange name", exchange)
    validate_namespace(namespace)
    return physical_name(exchange, namespace, ordered)


def queue_name_for(queue: str, namespace: str = "", ordered: bool = False) -> str:
    """The validated physical queue name of a single-consumer channel."""
    _check_part("channel queue name", queue)
    validate_namespace(namespace)
    return physical_name(queue, namespace, ordered)


def _check_range(what: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidChannelSpec(
            f"{what} must be a whole number from {low} to {high}, got {value!r}"
        )
    if not low <= value <= high:
        raise InvalidChannelSpec(f"{what} must be from {low} to {high}, got {value}")


def declared_track_status(tags: Mapping[str, str]) -> bool | None:
    """A queue's declaration of its channel's `track_status` (TAG_TRACK_STATUS): True, False,
    or None when the queue carries none (made before the tag existed, or not from a spec)."""
    value = tags.get(TAG_TRACK_STATUS)
    if value is None:
        return None
    return value.strip().lower() == "true"


def declared_keep_results(tags: Mapping[str, str]) -> bool | None:
    """A queue's declaration of its channel's `keep_results` (TAG_KEEP_RESULTS): True, False,
    or None when the queue carries none."""
    value = tags.get(TAG_KEEP_RESULTS)
    if value is None:
        return None
    return value.strip().lower() == "true"


#: The largest `max_concurrency` a channel may declare.
MAX_CONCURRENCY = 10_000
#: Rate periods a limit may be written in, and their seconds.
RATE_PERIODS: dict[str, int] = {"s": 1, "min": 60, "h": 3600}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|min|h)\s*$")


@dataclass(frozen=True)
class Rate:
    """A rate limit: `count` jobs (or weight units) per `period` seconds.

    Written "N/s", "N/min" or "N/h" (N > 0, at most 1,000,000 per second); `str()` gives it
    back in that form."""

    count: float
    period: int
    unit: str = "s"

    @property
    def per_second(self) -> float:
        return self.count / self.period

    def __str__(self) -> str:
        return f"{self.count:g}/{self.unit}"


def parse_rate(value: object, what: str = "rate_limit") -> Rate:
    """A `Rate` from "N/s", "N/min" or "N/h"; InvalidChannelSpec naming `what` and the allowed
    forms otherwise."""
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidChannelSpec(
            f"{what} must be 'N/s', 'N/min' or 'N/h' (N > 0), got {value!r}")
    count, unit = float(match.group(1)), match.group(2)
    period = RATE_PERIODS[unit]
    if count <= 0 or count / period > 1_000_000:
        raise InvalidChannelSpec(
            f"{what} must be more than 0 and at most 1000000/s, got {value!r}")
    return Rate(count, period, unit)


def parse_tags(tags: Mapping[str, str]) -> ChannelTags:
    """Read ownership tags back from a resource's tags (used by the ops Lambdas)."""
    def threshold(tag: str) -> int | None:
        value = tags.get(tag)
        return int(value) if value and value.isdigit() else None

    return ChannelTags(
        owner=tags.get(TAG_OWNER, ""),
        team=tags.get(TAG_TEAM, ""),
        alarm_threshold=threshold(TAG_ALARM_THRESHOLD),
        dlq_alarm_threshold=threshold(TAG_DLQ_ALARM_THRESHOLD),
        critical=tags.get(TAG_CRITICAL, "false").lower() == "true",
    )
