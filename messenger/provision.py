"""Runtime provisioning of a channel's resources from its `ChannelSpec`.

`auto` mode creates what is missing, idempotently (a second run changes nothing); `verify` mode
only checks and raises `ChannelNotFound` naming the missing resource (what CDK-deployed services
use, since CloudFormation owns their infrastructure). The resource attributes come from the same
`ChannelSpec` methods the CDK constructs use.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, error_code
from messenger.channel import (
    ALLOW_TOPIC_DEAD_LETTERS_SID,
    ALLOW_TOPIC_SID,
    TAG_MANAGED,
    ChannelSpec,
    exchange_tags,
    topic_attributes,
    topic_name_for,
)
from messenger.errors import ChannelNotFound, ProvisioningError
from messenger.offload import OFFLOAD_PREFIX, lifecycle_days
from messenger.settings import Settings

QUEUE_MISSING_CODES = frozenset(
    {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "NonExistentQueue"}
)
TOPIC_MISSING_CODES = frozenset({"NotFound", "NotFoundException"})
QUEUE_EXISTS_CODES = frozenset({"QueueAlreadyExists", "QueueNameExists"})
#: Attributes SQS refuses to change after creation.
_IMMUTABLE_QUEUE_ATTRIBUTES = frozenset({"FifoQueue"})


@dataclass(frozen=True)
class QueueRef:
    """A queue's physical name, URL and ARN."""

    name: str
    url: str
    arn: str


@dataclass(frozen=True)
class ChannelResources:
    """What a channel resolves to: its queue, DLQ and, for exchanges, topic and subscription."""

    spec: ChannelSpec
    queue: QueueRef
    dlq: QueueRef
    topic_arn: str | None = None
    subscription_arn: str | None = None
    #: For a prioritized channel: every level's resources, highest first (queue/dlq above are
    #: the default level's).
    levels: tuple[ChannelResources, ...] = ()


def is_missing_resource(error: BaseException) -> bool:
    """Whether an AWS error says a queue or topic does not exist."""
    code = error_code(error)
    return code in QUEUE_MISSING_CODES or code in TOPIC_MISSING_CODES


def tls_only_statement(resource_arn: str, action: str) -> dict[str, Any]:
    return {
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": action,
        "Resource": resource_arn,
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }


def queue_policy(queue_arn: str, topic_arn: str | None, sid: str = ALLOW_TOPIC_SID) -> str:
    """TLS-only, and for an exchange's queue (or DLQ, `sid`): the topic may send to it."""
    statements = [tls_only_statement(queue_arn, "sqs:*")]
    if topic_arn:
        statements.append(
            {
                "Sid": sid,
                "Effect": "Allow",
                "Principal": {"Service": "sns.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": queue_arn,
                "Condition": {"ArnEquals": {"aws:SourceArn": topic_arn}},
            }
        )
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


class Provisioner:
    """Creates (auto) or checks (verify) channel resources; safe to share between threads."""

    def __init__(self, clients: ClientFactory, settings: Settings) -> None:
        self.clients = clients
        self.settings = settings
        self._lock = threading.Lock()
        self._account_id: str | None = None
        self._key_arn: str | None = None
        self._bucket: str | None = None

    @property
    def auto(self) -> bool:
        return self.settings.provisioning == "auto"

    # -- identity and key ---------------------------------------------------------------
    @property
    def account_id(self) -> str:
        if self._account_id is None:
            self._account_id = str(self.clients.client("sts").get_caller_identity()["Account"])
        return self._account_id

    def arn(self, service: str, name: str) -> str:
        return f"arn:aws:{service}:{self.settings.region}:{self.account_id}:{name}"

    def key_arn(self) -> str:
        """The platform KMS key (created with its alias in auto mode when missing)."""
        with self._lock:
            if self._key_arn is None:
                self._key_arn = self._resolve_key()
            return self._key_arn

    def _resolve_key(self) -> str:
        kms = self.clients.client("kms")
        alias = self.settings.kms_alias
        try:
            return str(kms.describe_key(KeyId=alias)["KeyMetadata"]["Arn"])
        except ClientError as error:
            if error_code(error) != "NotFoundException":
                raise
        if not self.auto or not alias.startswith("alias/"):
            raise ChannelNotFound(
                f"KMS key {alias!r} does not exist (provisioning={self.settings.provisioning})"
            )
        key = kms.create_key(
            Description=f"messenger platform key ({self.settings.namespace or 'default'})",
            Policy=self._key_policy(),
            Tags=[{"TagKey": TAG_MANAGED, "TagValue": "true"}],
        )["KeyMetadata"]
        kms.enable_key_rotation(KeyId=key["KeyId"])
        try:
            kms.create_alias(AliasName=alias, TargetKeyId=key["KeyId"])
        except ClientError as error:
            # Another process won the race: use its key, drop ours.
            if error_code(error) != "AlreadyExistsException":
                raise
            kms.schedule_key_deletion(KeyId=key["KeyId"], PendingWindowInDays=7)
            return str(kms.describe_key(KeyId=alias)["KeyMetadata"]["Arn"])
        return str(key["Arn"])

    def _key_policy(self) -> str:
        root = f"arn:aws:iam::{self.account_id}:root"
        return json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "AccountAdmin",
                        "Effect": "Allow",
                        "Principal": {"AWS": root},
                        "Action": "kms:*",
                        "Resource": "*",
                    },
                    {
                        "Sid": "SnsDeliversToEncryptedQueues",
                        "Effect": "Allow",
                        "Principal": {"Service": "sns.amazonaws.com"},
                        "Action": ["kms:GenerateDataKey*", "kms:Decrypt"],
                        "Resource": "*",
                    },
                ],
            }
        )

    # -- queues -------------------------------------------------------------------------
    def find_queue(self, name: str) -> QueueRef | None:
        """The queue called `name`, or None when it does not exist."""
        try:
            url = self.clients.client("sqs").get_queue_url(QueueName=name)["QueueUrl"]
        except ClientError as error:
            if error_code(error) in QUEUE_MISSING_CODES:
                return None
            raise
        return QueueRef(name=name, url=str(url), arn=self.queue_arn(str(url), name))

    def queue_arn(self, url: str, name: str) -> str:
        """A queue's ARN; the account from its URL ('<endpoint>/<account id>/<name>', as SQS
        answers GetQueueUrl) when it holds one, so that resolving a channel needs no STS call."""
        parts = url.rstrip("/").rsplit("/", 2)
        if len(parts) == 3 and parts[2] == name and parts[1].isdigit() and len(parts[1]) == 12:
            return f"arn:aws:sqs:{self.settings.region}:{parts[1]}:{name}"
        return self.arn("sqs", name)

    def require_queue(self, name: str, what: str) -> QueueRef:
        found = self.find_queue(name)
        if found is None:
            raise ChannelNotFound(self.describe_missing(f"queue {name!r} ({what})"))
        return found

    def _create_queue(
        self, name: str, attributes: dict[str, str], tags: dict[str, str], *,
        role: str, topic_arn: str | None = None,
    ) -> QueueRef:
        """Create the queue, or bring an existing one in line with the spec; `role` says what it
        is for in errors ("queue of channel 'x'"); `topic_arn`: the exchange it receives from."""
        sqs = self.clients.client("sqs")
        attributes = {
            **attributes,
            "KmsMasterKeyId": self.key_arn(),
            "KmsDataKeyReusePeriodSeconds": "300",
        }
        try:
            url = sqs.create_queue(QueueName=name, Attributes=attributes, tags=tags)["QueueUrl"]
        except ClientError as error:
            if error_code(error) not in QUEUE_EXISTS_CODES:
                raise
            # It exists with other attributes: bring the mutable ones in line with the spec,
            # unless another exchange delivers to it (its policy would be replaced: that
            # exchange's subscription would silently stop delivering).
            url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
            self._refuse_foreign_exchange(url, name, role, topic_arn)
            mutable = {k: v for k, v in attributes.items() if k not in _IMMUTABLE_QUEUE_ATTRIBUTES}
            sqs.set_queue_attributes(QueueUrl=url, Attributes=mutable)
            sqs.tag_queue(QueueUrl=url, Tags=tags)
        return QueueRef(name=name, url=str(url), arn=self.arn("sqs", name))

    def ensure_queues(
        self, spec: ChannelSpec, topic_arn: str | None = None
    ) -> tuple[QueueRef, QueueRef]:
        """The channel's queue and DLQ, with redrive policy, encryption, policy and tags."""
        if not self.auto:
            return (
                self.require_queue(spec.queue_name, f"channel {spec.name!r}"),
                self.require_queue(spec.dlq_name, f"dead-letter queue of {spec.name!r}"),
            )
        dlq_attributes = {
            **spec.dlq_attributes(),
            # An exchange's topic dead-letters what it cannot deliver here (subscription DLQ).
            "Policy": queue_policy(
                self.arn("sqs", spec.dlq_name), topic_arn, ALLOW_TOPIC_DEAD_LETTERS_SID
            ),
        }
        dlq = self._create_queue(
            spec.dlq_name, dlq_attributes, spec.resource_tags("dlq"),
            role=f"dead-letter queue of channel {spec.name!r}", topic_arn=topic_arn,
        )
        attributes = {
            **spec.queue_attributes(),
            "RedrivePolicy": json.dumps(spec.redrive_policy(dlq.arn)),
            "Policy": queue_policy(self.arn("sqs", spec.queue_name), topic_arn),
        }
        queue = self._create_queue(
            spec.queue_name, attributes, spec.resource_tags("queue"),
            role=f"queue of channel {spec.name!r}", topic_arn=topic_arn,
        )
        return queue, dlq

    def _refuse_foreign_exchange(
        self, url: str, name: str, role: str, topic_arn: str | None
    ) -> None:
        """ProvisioningError when the existing queue admits a topic other than `topic_arn`."""
        current = self.clients.client("sqs").get_queue_attributes(
            QueueUrl=url, AttributeNames=["Policy"]
        )["Attributes"].get("Policy")
        foreign = sorted(set(source_topics(current)) - {topic_arn})
        if foreign:
            raise ProvisioningError(
                f"queue {name!r} already receives from the topic {', '.join(foreign)}; as the "
                f"{role} it would stop that exchange's delivery. Queue names are unique per "
                f"account and region: rename the channel (its queue part) or use another "
                f"namespace; delete the old queue only if its channel is gone."
            )

    # -- topics and subscriptions ---------------------------------------------------------
    def find_topic(self, name: str) -> str | None:
        arn = self.arn("sns", name)
        try:
            self.clients.client("sns").get_topic_attributes(TopicArn=arn)
        except ClientError as error:
            if error_code(error) in TOPIC_MISSING_CODES:
                return None
            raise
        return arn

    def ensure_topic(self, name: str, attributes: dict[str, str], tags: dict[str, str]) -> str:
        """The topic's ARN; created with encryption and tags in auto mode."""
        if not self.auto:
            found = self.find_topic(name)
            if found is None:
                raise ChannelNotFound(self.describe_missing(f"topic {name!r}"))
            return found
        sns = self.clients.client("sns")
        arn = self.find_topic(name)
        if arn is None:
            response = sns.create_topic(
                Name=name,
                Attributes={**attributes, "KmsMasterKeyId": self.key_arn()},
                Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
            )
            arn = str(response["TopicArn"])
        return arn

    def ensure_exchange(self, exchange: str, ordered: bool) -> str:
        """The topic of an exchange (what a MultiProducer publishes to)."""
        namespace = self.settings.namespace
        return self.ensure_topic(
            topic_name_for(exchange, namespace, ordered),
            topic_attributes(ordered),
            exchange_tags(exchange, namespace),
        )

    def ensure_subscription(
        self, spec: ChannelSpec, topic_arn: str, queue: QueueRef, dlq: QueueRef
    ) -> str:
        """The queue's subscription to the topic with raw delivery, the spec's filter policy and
        the channel's DLQ as its RedrivePolicy (undeliverable messages are kept, not dropped)."""
        sns = self.clients.client("sns")
        existing = self.find_subscription(topic_arn, queue.arn)
        policy = spec.filter_policy_json()
        redrive = json.dumps(spec.subscription_redrive_policy(dlq.arn))
        if existing is None:
            if not self.auto:
                raise ChannelNotFound(
                    self.describe_missing(f"subscription of queue {queue.name!r} to {topic_arn}")
                )
            attributes = {"RawMessageDelivery": "true", "RedrivePolicy": redrive}
            if policy is not None:
                attributes.update(FilterPolicy=policy, FilterPolicyScope="MessageAttributes")
            return str(
                sns.subscribe(
                    TopicArn=topic_arn,
                    Protocol="sqs",
                    Endpoint=queue.arn,
                    Attributes=attributes,
                    ReturnSubscriptionArn=True,
                )["SubscriptionArn"]
            )
        if self.auto:
            current = sns.get_subscription_attributes(SubscriptionArn=existing)["Attributes"]
            current_policy = current.get("FilterPolicy") or None
            if _normalized(current_policy) != _normalized(policy):
                # An empty policy removes the filter.
                sns.set_subscription_attributes(
                    SubscriptionArn=existing,
                    AttributeName="FilterPolicy",
                    AttributeValue=policy or "{}",
                )
            if _normalized(current.get("RedrivePolicy")) != _normalized(redrive):
                # A subscription made before subscription DLQs existed gets one.
                sns.set_subscription_attributes(
                    SubscriptionArn=existing, AttributeName="RedrivePolicy", AttributeValue=redrive
                )
        return existing

    def find_subscription(self, topic_arn: str, queue_arn: str) -> str | None:
        """The ARN of the topic's subscription delivering to the queue, or None."""
        paginator = self.clients.client("sns").get_paginator("list_subscriptions_by_topic")
        for page in paginator.paginate(TopicArn=topic_arn):
            for subscription in page.get("Subscriptions", []):
                if subscription.get("Endpoint") == queue_arn:
                    return str(subscription["SubscriptionArn"])
        return None

    # -- whole channels -------------------------------------------------------------------
    def ensure_channel(self, spec: ChannelSpec) -> ChannelResources:
        """Create (auto) or check (verify) everything the channel needs; idempotent.

        A prioritized channel gets every level's queue, DLQ and subscription."""
        if spec.priorities:
            levels = tuple(self.ensure_channel(level) for level in spec.level_specs())
            default = next(r for r in levels if r.spec.priority_level == spec.default_level)
            return replace(default, spec=spec, levels=levels)
        try:
            topic_arn = None
            if spec.topic_name is not None:
                topic_arn = self.ensure_topic(
                    spec.topic_name, spec.topic_attributes(), spec.topic_tags()
                )
            queue, dlq = self.ensure_queues(spec, topic_arn)
            subscription = (
                self.ensure_subscription(spec, topic_arn, queue, dlq) if topic_arn else None
            )
        except ClientError as error:
            raise ProvisioningError(
                f"provisioning channel {spec.name!r} failed: {error}"
            ) from error
        return ChannelResources(spec, queue, dlq, topic_arn, subscription)

    # -- offload bucket -------------------------------------------------------------------
    def ensure_bucket(self) -> str:
        """The offload bucket: SSE-KMS, public access blocked, TLS only, lifecycle expiry."""
        with self._lock:
            if self._bucket is not None:
                return self._bucket
        name = self.settings.bucket_name(self.account_id)
        s3 = self.clients.client("s3")
        try:
            s3.head_bucket(Bucket=name)
        except ClientError as error:
            if error_code(error) not in ("404", "NoSuchBucket", "NotFound"):
                raise
            if not self.auto:
                raise ChannelNotFound(self.describe_missing(f"offload bucket {name!r}")) from None
            self._create_bucket(name)
        with self._lock:
            self._bucket = name
        return name

    def _create_bucket(self, name: str) -> None:
        s3 = self.clients.client("s3")
        kwargs: dict[str, Any] = {"Bucket": name}
        if self.settings.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.settings.region}
        s3.create_bucket(**kwargs)
        s3.put_public_access_block(
            Bucket=name,
            PublicAccessBlockConfiguration={
                "BlockPublicAcls": True,
                "IgnorePublicAcls": True,
                "BlockPublicPolicy": True,
                "RestrictPublicBuckets": True,
            },
        )
        s3.put_bucket_encryption(
            Bucket=name,
            ServerSideEncryptionConfiguration={
                "Rules": [
                    {
                        "ApplyServerSideEncryptionByDefault": {
                            "SSEAlgorithm": "aws:kms",
                            "KMSMasterKeyID": self.key_arn(),
                        },
                        "BucketKeyEnabled": True,
                    }
                ]
            },
        )
        s3.put_bucket_lifecycle_configuration(
            Bucket=name,
            LifecycleConfiguration={
                "Rules": [
                    {
                        "ID": "expire-offloaded-payloads",
                        "Status": "Enabled",
                        "Filter": {"Prefix": OFFLOAD_PREFIX},
                        "Expiration": {"Days": lifecycle_days(14 * 86_400)},
                    }
                ]
            },
        )
        bucket_arn = f"arn:aws:s3:::{name}"
        if self.settings.bucket_tls_policy:
            s3.put_bucket_policy(
                Bucket=name,
                Policy=json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [tls_only_statement(f"{bucket_arn}/*", "s3:*")],
                    }
                ),
            )
        s3.put_bucket_tagging(
            Bucket=name, Tagging={"TagSet": [{"Key": TAG_MANAGED, "Value": "true"}]}
        )

    def describe_missing(self, what: str) -> str:
        """Why `what` is missing and what to do, for an error message."""
        if self.auto:  # auto creates it only where its owner starts: not here
            return (
                f"{what} does not exist, and only its owner creates it (provisioning=auto): "
                f"check the name, or start that channel's consumer (or deploy the CDK app) first"
            )
        return (
            f"{what} does not exist (provisioning={self.settings.provisioning}; deploy it with "
            f"the CDK app, or set MESSENGER_PROVISIONING=auto to create it at first use)"
        )


def source_topics(policy: str | None) -> list[str]:
    """The SNS topic ARNs a queue policy lets deliver (`aws:SourceArn` of its Allow statements)."""
    if not policy:
        return []
    topics = []
    for statement in json.loads(policy).get("Statement", []):
        if statement.get("Effect") != "Allow":
            continue
        for operator in statement.get("Condition", {}).values():
            sources = operator.get("aws:SourceArn", [])
            for source in [sources] if isinstance(sources, str) else sources:
                if str(source).startswith("arn:") and ":sns:" in str(source):
                    topics.append(str(source))
    return topics


def _normalized(policy: str | None) -> Any:
    if not policy:
        return None
    parsed = json.loads(policy)
    return parsed or None
