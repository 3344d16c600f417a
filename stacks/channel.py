"""`Channel`: a channel's SQS queue, DLQ and (for `exchange.queue`) SNS topic and subscription.

Every attribute comes from the same `ChannelSpec` the runtime provisioner uses: the L1 resources
are fed from `spec.queue_attributes()`, `spec.dlq_attributes()`, `spec.topic_attributes()`,
`spec.redrive_policy()` and `spec.filter_policy()`, so the deployed channel and one created at
first use are the same channel. Physical names are the runtime's (`spec.queue_name`, ...), so a
producer or consumer in `verify` mode finds the deployed resources.
"""

from __future__ import annotations

import re
from typing import Any

import jsii
from aws_cdk import ArnFormat, RemovalPolicy, Stack, Tags, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct, IConstruct, IValidation

from messenger.channel import ALLOW_TOPIC_DEAD_LETTERS_SID, ALLOW_TOPIC_SID, ChannelSpec
from stacks.topology import Topology

#: Seconds SQS reuses a data key before calling KMS again (the provisioner uses the same value):
#: the 5-minute default, a balance between KMS cost and key freshness.
KMS_DATA_KEY_REUSE_SECONDS = 300
#: What a producer needs on the platform key to send to an encrypted queue or topic, and to
#: resolve the key in verify mode (DescribeKey).
KEY_ACTIONS_PUBLISH = ("kms:GenerateDataKey", "kms:Decrypt", "kms:DescribeKey")
#: What a consumer needs on the key: read encrypted messages, forward some to the DLQ.
KEY_ACTIONS_CONSUME = ("kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")
QUEUE_ACTIONS_SEND = ("sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl")
#: A process reading its channel's declaration of `track_status` (the `messenger:track-status`
#: tag of its queues): a producer with track_status None at its first push, the HTTP API's
#: status answer, a consumer in verify mode (`QUEUE_ACTIONS_CONSUME` has it).
QUEUE_ACTIONS_READ_TRACKING = ("sqs:ListQueueTags",)
QUEUE_ACTIONS_CONSUME = (
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueAttributes",
    "sqs:GetQueueUrl",
    # An operator's pause is a tag on the queue (messenger.jobs.controls), read per heartbeat;
    # in verify mode, the channel's track_status declaration too (Consumer.check_tracking).
    "sqs:ListQueueTags",
    # A job held back by a limit or a handler's RateLimited goes back to its own queue as a new
    # message (messenger.consume.mailbox.Mailbox.hold; docs/flow-control.md), on any channel.
    "sqs:SendMessage",
)
#: A consumer in verify mode checks its topic and subscription exist.
TOPIC_ACTIONS_VERIFY = ("sns:GetTopicAttributes", "sns:ListSubscriptionsByTopic")
TOPIC_ACTIONS_PUBLISH = ("sns:Publish", "sns:GetTopicAttributes")


def cfn_properties(attributes: dict[str, str]) -> dict[str, Any]:
    """SQS/SNS API attributes (`DelaySeconds: "0"`) as L1 keyword arguments (`delay_seconds=0`).

    CloudFormation names these properties exactly like the API attributes; only the value types
    differ ("true" -> True, "300" -> 300).
    """
    return {_snake_case(name): _typed(value) for name, value in attributes.items()}


def _snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _typed(value: str) -> Any:
    if value in ("true", "false"):
        return value == "true"
    return int(value) if value.isdigit() else value


def _tls_only(resource: str, action: str) -> iam.PolicyStatement:
    return iam.PolicyStatement(
        sid="DenyInsecureTransport",
        effect=iam.Effect.DENY,
        principals=[iam.AnyPrincipal()],
        actions=[action],
        resources=[resource],
        conditions={"Bool": {"aws:SecureTransport": "false"}},
    )


def construct_id(name: str, ordered: bool = False) -> str:
    """A construct id for a channel or exchange name, the same in every namespace."""
    return re.sub(r"[^A-Za-z0-9]", "", name.title()) + ("Fifo" if ordered else "")


def channel_arn(scope: IConstruct, owner: IConstruct, service: str, name: str, local: str) -> str:
    """The ARN of the queue or topic `name` (owned by `owner`) as `scope`'s stack names it:
    `local` (a reference) in the owner's stack, else built from the deterministic name with
    that stack's partition, region and account, never a cross-stack export. An export would
    tie the stacks: the owner could not drop a channel another stack still imports, so
    removing one would take two deploys."""
    here, there = Stack.of(scope), Stack.of(owner)
    if here.node.path == there.node.path:
        return local
    for part in ("account", "region"):
        mine, theirs = getattr(here, part), getattr(there, part)
        if not Token.is_unresolved(mine) and not Token.is_unresolved(theirs) \
                and mine != theirs:
            raise ValueError(
                f"{service} {name!r} of stack {there.stack_name} ({part} {theirs}) cannot be "
                f"named from stack {here.stack_name} ({part} {mine}): channels are used from "
                f"the account and region they are deployed in"
            )
    return here.format_arn(service=service, resource=name,
                           arn_format=ArnFormat.NO_RESOURCE_NAME)


def _depend_on(scope: IConstruct, owner: IConstruct, reason: str) -> None:
    """`scope`'s stack deploys after `owner`'s (a dependency, not an export)."""
    here, there = Stack.of(scope), Stack.of(owner)
    if here.node.path != there.node.path:
        here.add_stack_dependency(there, reason)


def _stack_of(grantee: iam.IGrantable) -> IConstruct | None:
    return grantee if isinstance(grantee, Construct) else None


class ExchangeTopic(Construct):
    """The SNS topic of one exchange, shared by every channel of that exchange in the app.

    Use `ExchangeTopic.of(scope, spec, key)`: the first channel of an exchange creates the topic,
    the others (in any stack of the app) subscribe to the same one.
    """

    def __init__(
        self, scope: Construct, id: str, *, spec: ChannelSpec, key: kms.IKey,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        assert spec.exchange is not None and spec.topic_name is not None
        self.name = spec.topic_name
        self.resource = sns.CfnTopic(
            self,
            "Resource",
            topic_name=spec.topic_name,
            **cfn_properties(spec.topic_attributes()),
            kms_master_key_id=key.key_arn,
        )
        self.resource.apply_removal_policy(removal_policy)
        self.topic = sns.Topic.from_topic_attributes(
            self, "Ref", topic_arn=self.resource.ref, key_arn=key.key_arn
        )
        sns.CfnTopicPolicy(
            self,
            "Policy",
            topics=[self.resource.ref],
            policy_document=iam.PolicyDocument(
                statements=[_tls_only(self.resource.ref, "sns:Publish")]
            ),
        )
        for key_name, value in spec.topic_tags().items():
            Tags.of(self).add(key_name, value)
        Topology.of(self).register(
            self.resource, self, "topic",
            f"exchange {spec.exchange!r} (namespace {spec.namespace!r})",
        )

    def topic_arn_in(self, scope: IConstruct) -> str:
        """The topic's ARN as `scope`'s stack names it (no cross-stack export)."""
        return channel_arn(scope, self, "sns", self.name, self.topic.topic_arn)

    @classmethod
    def of(
        cls, scope: Construct, spec: ChannelSpec, key: kms.IKey,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> ExchangeTopic:
        """The app's topic for `spec`'s exchange, created in `scope`'s stack on first use.

        Channels of one exchange in other stacks of the app subscribe to that same topic (by
        its ARN, built from its name; their stack deploys after the topic's), so an exchange
        may span stacks without a second topic and without an export. The
        lookup key is the stack's environment, the namespace, the exchange and its ordering: a
        staging channel never finds prod's topic, and a stack in another account or region
        gets its own."""
        assert spec.exchange is not None
        topology = Topology.of(scope)
        exchange = topology.exchange_key(scope, spec.namespace, spec.exchange)
        existing = topology.find_exchange(exchange, spec.ordered)
        if existing is None:
            stack = Stack.of(scope)
            topic_id = f"Exchange{construct_id(spec.exchange, spec.ordered)}"
            if stack.node.try_find_child(topic_id) is not None:  # the same exchange, another
                topic_id += construct_id(spec.namespace or "Default")  # namespace or account
            existing = cls(stack, topic_id, spec=spec, key=key, removal_policy=removal_policy)
            topology.add_exchange(exchange, spec.ordered, existing)
        topology.add_exchange_channel(exchange, spec.ordered, spec.name)
        return existing


class ChannelQueue(Construct):
    """The queue and DLQ of one spec (a channel, or one priority level of it), their TLS-only
    policies, tags and, for an exchange, the subscription with the spec's filter policy."""

    def __init__(
        self, scope: Construct, id: str, *, spec: ChannelSpec, key: kms.IKey,
        exchange: ExchangeTopic | None, removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        self.spec = spec
        self.key = key
        self.dlq_resource = sqs.CfnQueue(
            self,
            "DeadLetterQueue",
            queue_name=spec.dlq_name,
            **cfn_properties(spec.dlq_attributes()),
            kms_master_key_id=key.key_arn,
            kms_data_key_reuse_period_seconds=KMS_DATA_KEY_REUSE_SECONDS,
        )
        self.queue_resource = sqs.CfnQueue(
            self,
            "Queue",
            queue_name=spec.queue_name,
            **cfn_properties(spec.queue_attributes()),
            kms_master_key_id=key.key_arn,
            kms_data_key_reuse_period_seconds=KMS_DATA_KEY_REUSE_SECONDS,
            redrive_policy=spec.redrive_policy(self.dlq_resource.attr_arn),
        )
        # Retained by default: deleting or replacing the stack must not drop messages (a DLQ's
        # dead letters above all); with fixed physical names a replacement would fail anyway.
        self.dlq_resource.apply_removal_policy(removal_policy)
        self.queue_resource.apply_removal_policy(removal_policy)
        self.queue = self._import_queue("QueueRef", self.queue_resource)
        self.dlq = self._import_queue("DeadLetterQueueRef", self.dlq_resource)
        topic_arn = None
        if exchange is not None:
            # A topic in another stack (an exchange spanning stacks) by its name: that stack
            # deploys first, and no export ties the two.
            topic_arn = exchange.topic_arn_in(self)
            _depend_on(self, exchange, f"channel {spec.name!r} subscribes to its topic")
        # The exchange's topic dead-letters here what it cannot deliver to the queue.
        dlq_policy = self._queue_policy(
            "DeadLetterQueuePolicy", self.dlq_resource, topic_arn, ALLOW_TOPIC_DEAD_LETTERS_SID
        )
        self._tag(self.dlq_resource, "dlq")
        self._tag(self.queue_resource, "queue")
        topology = Topology.of(self)
        topology.register(self.queue_resource, self, "queue", f"channel {spec.name!r}")
        topology.register(self.dlq_resource, self, "dead-letter queue", f"channel {spec.name!r}")

        self.subscription: sns.CfnSubscription | None = None
        if topic_arn is not None:
            queue_policy = self._queue_policy(
                "QueuePolicy", self.queue_resource, topic_arn, ALLOW_TOPIC_SID
            )
            policy = spec.filter_policy()
            self.subscription = sns.CfnSubscription(
                self,
                "Subscription",
                protocol="sqs",
                topic_arn=topic_arn,
                endpoint=self.queue_resource.attr_arn,
                raw_message_delivery=True,
                filter_policy=policy,
                filter_policy_scope="MessageAttributes" if policy is not None else None,
                redrive_policy=spec.subscription_redrive_policy(self.dlq_resource.attr_arn),
            )
            self.subscription.add_resource_dependency(
                queue_policy, "the topic may deliver only once the queue policy lets it"
            )
            self.subscription.add_resource_dependency(
                dlq_policy, "the topic may dead-letter only once the DLQ policy lets it"
            )
        else:
            self._queue_policy("QueuePolicy", self.queue_resource, None, ALLOW_TOPIC_SID)
        self.node.add_validation(_FifoPairValidation(self))

    def queue_arn_in(self, scope: IConstruct | None) -> str:
        """The queue's ARN as `scope`'s stack names it (no cross-stack export)."""
        if scope is None:
            return self.queue.queue_arn
        return channel_arn(scope, self, "sqs", self.spec.queue_name, self.queue.queue_arn)

    def dlq_arn_in(self, scope: IConstruct | None) -> str:
        if scope is None:
            return self.dlq.queue_arn
        return channel_arn(scope, self, "sqs", self.spec.dlq_name, self.dlq.queue_arn)

    # -- helpers ----------------------------------------------------------------------------
    def _import_queue(self, id: str, resource: sqs.CfnQueue) -> sqs.IQueue:
        return sqs.Queue.from_queue_attributes(
            self,
            id,
            queue_arn=resource.attr_arn,
            queue_url=resource.ref,
            queue_name=resource.attr_queue_name,
            key_arn=self.key.key_arn,
            fifo=self.spec.ordered,
        )

    def _queue_policy(
        self, id: str, queue: sqs.CfnQueue, topic_arn: str | None, sid: str
    ) -> sqs.CfnQueuePolicy:
        statements = [_tls_only(queue.attr_arn, "sqs:*")]
        if topic_arn is not None:
            statements.append(
                iam.PolicyStatement(
                    sid=sid,
                    principals=[iam.ServicePrincipal("sns.amazonaws.com")],
                    actions=["sqs:SendMessage"],
                    resources=[queue.attr_arn],
                    conditions={"ArnEquals": {"aws:SourceArn": topic_arn}},
                )
            )
        return sqs.CfnQueuePolicy(
            self, id, queues=[queue.ref],
            policy_document=iam.PolicyDocument(statements=statements),
        )

    def _tag(self, resource: Construct, role: str) -> None:
        for key_name, value in self.spec.resource_tags(role).items():
            Tags.of(resource).add(key_name, value)


class Channel(Construct):
    """One channel, built from its `ChannelSpec`.

    spec: the channel (its namespace is part of every physical name).
    key: the platform CMK; encrypts queues, DLQs and topic (the key policy lets SNS use it).
    removal_policy: what CloudFormation does with the queues, DLQs and topic when they leave the
        stack (default RETAIN: messages survive a stack deletion or a replacing update;
        RemovalPolicy.DESTROY for throwaway stages).

    A channel with priorities gets one `ChannelQueue` per level (`spec.level_specs()`, highest
    first), each with its own DLQ and subscription. Exposes `.levels` (every `ChannelQueue`),
    `.queue`, `.dlq` (`sqs.IQueue` of the first level: the only one without priorities),
    `.queues` / `.dlqs` (all levels), `.topic` (`sns.ITopic`, None for a single-consumer channel),
    `.topic_resource`, and `grant_publish` / `grant_consume` covering every level.
    """

    def __init__(
        self, scope: Construct, id: str, *, spec: ChannelSpec, key: kms.IKey,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        if not isinstance(spec, ChannelSpec):
            raise TypeError(
                f"Channel {id!r}: spec must be a ChannelSpec, got {type(spec).__name__}"
            )
        self.spec = spec
        self.key = key
        self.exchange = (
            ExchangeTopic.of(self, spec, key, removal_policy) if spec.exchange else None
        )
        self.topic: sns.ITopic | None = self.exchange.topic if self.exchange else None
        self.topic_resource = self.exchange.resource if self.exchange else None
        self.levels = [
            ChannelQueue(
                self,
                f"Level{construct_id(level.priority_level)}" if level.priority_level else "Queue",
                spec=level, key=key, exchange=self.exchange, removal_policy=removal_policy,
            )
            for level in spec.level_specs()
        ]
        first = self.levels[0]
        self.queue, self.dlq = first.queue, first.dlq
        self.queue_resource, self.dlq_resource = first.queue_resource, first.dlq_resource
        self.subscription = first.subscription

    def topic_arn_in(self, scope: IConstruct | None) -> str:
        """The exchange topic's ARN as `scope`'s stack names it (no cross-stack export)."""
        assert self.exchange is not None, f"channel {self.spec.name!r} has no topic"
        if scope is None:
            return self.exchange.topic.topic_arn
        return self.exchange.topic_arn_in(scope)

    @property
    def queues(self) -> list[sqs.IQueue]:
        return [level.queue for level in self.levels]

    @property
    def dlqs(self) -> list[sqs.IQueue]:
        return [level.dlq for level in self.levels]

    # -- grants -----------------------------------------------------------------------------
    def grant_publish(self, grantee: iam.IGrantable, *, reads_tracking: bool = True
                      ) -> iam.Grant:
        """Let `grantee` publish: to the topic of an exchange, else to the queue(s); and the key.

        reads_tracking: a producer process reads the channel's `track_status` declaration from
        its queues' tags at its first push (sqs:ListQueueTags on them; an exchange declares
        nothing, its producers read no tag). False for a role no producer code runs as
        (EventBridge Scheduler's: it only sends)."""
        scope = _stack_of(grantee)
        if self.exchange is not None:
            grant = iam.Grant.add_to_principal(
                grantee=grantee, actions=list(TOPIC_ACTIONS_PUBLISH),
                resource_arns=[self.topic_arn_in(scope)],
            )
        else:
            actions = QUEUE_ACTIONS_SEND + (QUEUE_ACTIONS_READ_TRACKING if reads_tracking
                                            else ())
            grant = iam.Grant.add_to_principal(
                grantee=grantee, actions=list(actions),
                resource_arns=[level.queue_arn_in(scope) for level in self.levels],
            )
        self.key.grant(grantee, *KEY_ACTIONS_PUBLISH)
        return grant

    def grant_consume(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let `grantee` consume every level, forward to the DLQs and check the channel exists."""
        scope = _stack_of(grantee)
        grant = iam.Grant.add_to_principal(
            grantee=grantee, actions=list(QUEUE_ACTIONS_CONSUME),
            resource_arns=[level.queue_arn_in(scope) for level in self.levels],
        )
        iam.Grant.add_to_principal(
            grantee=grantee, actions=list(QUEUE_ACTIONS_SEND),
            resource_arns=[level.dlq_arn_in(scope) for level in self.levels],
        )
        if self.exchange is not None:
            iam.Grant.add_to_principal(
                grantee=grantee, actions=list(TOPIC_ACTIONS_VERIFY),
                resource_arns=[self.topic_arn_in(scope)],
            )
        self.key.grant(grantee, *KEY_ACTIONS_CONSUME)
        return grant

@jsii.implements(IValidation)
class _FifoPairValidation:
    """Fails synthesis when a queue and its DLQ differ in FIFO-ness (SQS rejects the redrive)."""

    def __init__(self, channel: ChannelQueue) -> None:
        self.channel = channel

    def validate(self) -> list[str]:
        queue_fifo = bool(self.channel.queue_resource.fifo_queue)
        dlq_fifo = bool(self.channel.dlq_resource.fifo_queue)
        if queue_fifo == dlq_fifo:
            return []
        kind = {True: "FIFO", False: "standard"}
        return [
            f"channel {self.channel.spec.name!r}: the {kind[queue_fifo]} queue "
            f"{self.channel.spec.queue_name!r} has a {kind[dlq_fifo]} dead-letter queue; "
            f"SQS requires both to be FIFO or both standard (set ChannelSpec.ordered)"
        ]
