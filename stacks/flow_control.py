"""Flow control at deploy time: how many handlers a channel's consumers can run at once.

A channel's `max_concurrency` holds in one of two ways (docs/flow-control.md):
- the deployment caps it: a Fargate service runs at most `max_tasks × concurrency` handlers, a
  Lambda consumer at most its event sources' MaximumConcurrency; when every consumer of the
  channel in the app together stays within the limit, nothing more is needed;
- else the consumers take a shared lease per running job in the limits table
  (`messenger.jobs.limits`), which also holds a limit lowered at run time.

`ConcurrencyCaps.of(scope)` adds up the caps of the app's consumers per channel. Each consumer
gets `MESSENGER_CONCURRENCY_CAP`: the total of its channel's consumers, resolved at synthesis
once every consumer is added (a second service of the channel counts), or "" when one of them
is unbounded (a Lambda consumer without MaximumConcurrency, or in provisioned mode). The
consumer compares it with the channel's current limit and takes the lease only when the limit
is lower (or the cap unknown).

The limits table (`limits_table_name`, in `Foundation`) holds, per channel C
(`messenger.jobs.limits`, its module doc): `limits#C` (the run-time limits), `rate#C` and
`rate#C#tenant#<tenant>` (rate limiters), `concurrency#C` (the lease), `report#C` (the
consumers' reports). Channel names hold no '#', so these keys are C's alone. Grants follow:
- a consumer of C (`grant_limits_consume`): read and write C's keys only (take units, hold the
  lease, report, read the limits), never another channel's;
- operators (`grant_limits_operate`: the dashboard, `messenger limits`): read every item, write
  only limits records (`limits#*`), never a limiter, lease or report.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from typing import ClassVar

import jsii
from aws_cdk import Aws, IStableStringProducer, Lazy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct, IConstruct

from messenger.channel import ChannelSpec, limits_table_name
from stacks.nag import acknowledge, acknowledge_wildcard_resource
from stacks.ownership import any_name, ownership_condition, ownership_reason

#: The environment variable that carries the cap down to the consumer (both runtimes).
CONCURRENCY_CAP_VARIABLE = "MESSENGER_CONCURRENCY_CAP"


class ConcurrencyCaps:
    """The most handlers each channel's consumers in one app can run at once."""

    _by_root: ClassVar[weakref.WeakKeyDictionary[IConstruct, ConcurrencyCaps]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self) -> None:
        self._caps: dict[tuple[str, str], list[int | None]] = defaultdict(list)

    @classmethod
    def of(cls, scope: IConstruct) -> ConcurrencyCaps:
        root = scope.node.root
        if root not in cls._by_root:
            cls._by_root[root] = ConcurrencyCaps()
        return cls._by_root[root]

    def add(self, spec: ChannelSpec, cap: int | None) -> str:
        """One more consumer of `spec`'s channel that runs at most `cap` handlers at once
        (None: no bound). Returns the value of its MESSENGER_CONCURRENCY_CAP (a token resolved
        at synthesis)."""
        self._caps[(spec.namespace, spec.name)].append(cap)
        return Lazy.string(_Total(self, spec), display_hint=CONCURRENCY_CAP_VARIABLE)

    def total(self, spec: ChannelSpec) -> int | None:
        """The channel's consumers' caps added up; None when one of them is unbounded."""
        caps = self._caps[(spec.namespace, spec.name)]
        if any(cap is None for cap in caps):
            return None
        return sum(cap for cap in caps if cap is not None)


@jsii.implements(IStableStringProducer)
class _Total:
    def __init__(self, caps: ConcurrencyCaps, spec: ChannelSpec) -> None:
        self._caps = caps
        self._spec = spec

    def produce(self) -> str:
        total = self._caps.total(self._spec)
        return "" if total is None else str(total)


#: What a consumer does on its channel's items (`messenger.jobs.limits`): read the limits
#: (GetItem), reserve rate units, hold and renew its share of the lease, report (conditional
#: UpdateItems).
LIMITS_CONSUMER_ACTIONS = ("dynamodb:GetItem", "dynamodb:UpdateItem")
#: The CloudWatch namespace of the consumers' flow-control metrics
#: (`messenger.jobs.limits.METRIC_NAMESPACE`; stacks import no runtime code, a test compares).
METRIC_NAMESPACE = "Messenger/FlowControl"
#: What an operator writes: a channel's limits record (`LimitStore.set`: one UpdateItem).
LIMITS_OPERATOR_WRITES = ("dynamodb:UpdateItem",)
#: The key of a channel's run-time limits record, `limits#<channel>`.
LIMITS_RECORD_PREFIX = "limits#"


def declares_limits(spec: ChannelSpec) -> bool:
    """Whether the channel declares a flow-control limit: only then do its consumers run the
    limit gate (and read limits set at run time), so only then do they get the limits table."""
    return any(value is not None for value in
               (spec.rate_limit, spec.tenant_rate_limit, spec.max_concurrency))


def limits_table_arn(namespace: str) -> str:
    """The limits table's ARN built from its name, as a grant in any stack of the platform's
    environment names it (no cross-stack export)."""
    return (f"arn:{Aws.PARTITION}:dynamodb:{Aws.REGION}:{Aws.ACCOUNT_ID}:table/"
            f"{limits_table_name(namespace)}")


def channel_keys(spec: ChannelSpec) -> list[str]:
    """The limits table's keys of `spec`'s channel (IAM `dynamodb:LeadingKeys` patterns): its
    limits record, rate limiters (the channel's, each tenant's), lease and reports."""
    name = spec.name
    return [f"{LIMITS_RECORD_PREFIX}{name}", f"rate#{name}", f"rate#{name}#tenant#*",
            f"concurrency#{name}", f"report#{name}"]


def grant_limits_consume(grantee: iam.IGrantable, spec: ChannelSpec, key: kms.IKey) -> None:
    """A consumer of `spec`'s channel: its own items of the limits table, the key, and its
    flow-control metrics (PutMetricData in METRIC_NAMESPACE only)."""
    table = limits_table_arn(spec.namespace)
    principal = grantee.grant_principal
    principal.add_to_principal_policy(iam.PolicyStatement(
        actions=["dynamodb:DescribeTable"], resources=[table]))
    principal.add_to_principal_policy(iam.PolicyStatement(
        actions=list(LIMITS_CONSUMER_ACTIONS), resources=[table],
        conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": channel_keys(spec)}}))
    key.grant(grantee, "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")
    # PutMetricData has no resource types: '*', held to the namespace by its condition key
    principal.add_to_principal_policy(iam.PolicyStatement(
        actions=["cloudwatch:PutMetricData"], resources=["*"],
        conditions={"StringEquals": {"cloudwatch:namespace": METRIC_NAMESPACE}}))
    if isinstance(principal, iam.Role):
        policy = principal.node.try_find_child("DefaultPolicy")
        if policy is not None:
            acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                        f"cloudwatch:PutMetricData has no resource types in IAM, so '*' is its "
                        f"only resource; the cloudwatch:namespace condition holds it to the "
                        f"flow-control metrics ({METRIC_NAMESPACE}).")


def limits_operator_statements(namespace: str) -> list[iam.PolicyStatement]:
    """An operator's statements on the namespace's limits table: read every item, write
    channels' limits records only (no limiter, lease or report)."""
    table = limits_table_arn(namespace)
    return [
        iam.PolicyStatement(
            sid="ReadFlowControl",
            actions=["dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:BatchGetItem"],
            resources=[table]),
        iam.PolicyStatement(
            sid="SetChannelLimits", actions=list(LIMITS_OPERATOR_WRITES), resources=[table],
            conditions={"ForAllValues:StringLike": {
                "dynamodb:LeadingKeys": [f"{LIMITS_RECORD_PREFIX}*"]}}),
    ]


def grant_limits_operate(grantee: iam.IGrantable, namespace: str, key: kms.IKey) -> None:
    """An operator's role (the dashboard's): `limits_operator_statements`, and the key."""
    for statement in limits_operator_statements(namespace):
        grantee.grant_principal.add_to_principal_policy(statement)
    key.grant(grantee, "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")


class LimitOperators(Construct):
    """The managed policy `<ns->messenger-limit-operators` for the people (or roles) who run
    `messenger limits set|show` and `messenger top`'s flow-control table: the limits table as an
    operator (`limits_operator_statements`), the channels found by their tags
    (`tag:GetResources`, which has no resource types) and their declarations read from the
    namespace's queues' tags (by the ns tags), the platform key. Attach `.policy` to their
    role or group.

    namespace: the platform's. key: the platform key (the table is encrypted with it)."""

    def __init__(self, scope: Construct, id: str, *, namespace: str, key: kms.IKey) -> None:
        super().__init__(scope, id)
        prefix = f"{namespace}-" if namespace else ""
        queues = any_name("sqs")
        self.policy = iam.ManagedPolicy(
            self, "Policy", managed_policy_name=f"{prefix}messenger-limit-operators",
            description="messenger limits: read flow control, set channels' limits",
            statements=[
                *limits_operator_statements(namespace),
                iam.PolicyStatement(sid="FindChannels", actions=["tag:GetResources"],
                                    resources=["*"]),
                iam.PolicyStatement(
                    sid="ReadDeclarations",
                    actions=["sqs:GetQueueUrl", "sqs:ListQueueTags"], resources=[queues],
                    conditions=ownership_condition(namespace)),
                iam.PolicyStatement(
                    sid="UseThePlatformKey",
                    actions=["kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"],
                    resources=[key.key_arn]),
            ])
        acknowledge_wildcard_resource(self.policy, queues, ownership_reason(namespace))
        acknowledge_wildcard_resource(
            self.policy, "*", "tag:GetResources has no resource types in IAM, so '*' is its "
                              "only resource; it reads tags, never changes them.")
