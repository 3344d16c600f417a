"""`Foundation`: the platform CMK, the offload bucket and its access-log bucket.

Names are the runtime's defaults (`messenger.channel.platform_key_alias` /
`offload_bucket_name`, which `Settings` uses too): a producer given only `MESSENGER_NAMESPACE`
finds them.
"""

from __future__ import annotations

from aws_cdk import (
    Aws,
    CfnCondition,
    CfnMapping,
    Duration,
    Fn,
    ICfnConditionExpression,
    RemovalPolicy,
    Stack,
    Tags,
    Token,
)
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk.region_info import RegionInfo
from constructs import Construct

from messenger.channel import (
    FIRED_CLAIM_PREFIX,
    SQS_MAX_RETENTION_SECONDS,
    TAG_MANAGED,
    TAG_NAMESPACE,
    dedup_table_name,
    idempotency_table_name,
    limits_table_name,
    offload_bucket_name,
    platform_key_alias,
    status_table_name,
    workers_table_name,
    workflows_table_name,
)
from stacks.nag import acknowledge_wildcard_resource
from stacks.ownership import any_name, ownership_condition, ownership_reason

#: Offloaded payloads outlive every message pointing at them (`messenger.offload.lifecycle_days`):
#: 14 days in the queue, 14 more for a FIFO dead-letter copy (SQS resets its enqueue time), one
#: day's margin; `messenger requeue` refreshes the payloads of the messages it moves.
OFFLOAD_EXPIRY_DAYS = 2 * -(-SQS_MAX_RETENTION_SECONDS // 86_400) + 1
#: Where offloaded bodies live in the bucket (`messenger.offload.OFFLOAD_PREFIX`); results too
#: large for their item go there through the same offload store (`messenger.jobs.results`).
OFFLOAD_PREFIX = "payloads/"
#: The workflows table's sparse index of what is not settled yet (`messenger.jobs.workflows`:
#: held jobs and groups), read by the sweeper: partition `open_shard`, sort `created_at`.
WORKFLOWS_OPEN_INDEX = "open"
#: What runs `messenger.jobs.workflows.Workflows` does on its table: hold a job (PutItem),
#: count a barrier, release or cancel (conditional UpdateItems), read a job's or group's record.
WORKFLOWS_TABLE_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
#: What `messenger.jobs.results.ResultStore` does on the status table's final items
#: (sk `~final`): write the outcome, register a waiter (UpdateItem), read one or many.
RESULT_ACTIONS = ("dynamodb:UpdateItem", "dynamodb:GetItem", "dynamodb:BatchGetItem")
ACCESS_LOG_EXPIRY_DAYS = 90
#: The feature flag that makes `server_access_logs_bucket` grant S3's log delivery through the
#: log bucket's policy; without it CDK grants an ACL, which a bucket with ACLs disabled
#: (BUCKET_OWNER_ENFORCED, what cdk-nag and AWS advise) refuses at synth.
SERVER_ACCESS_LOGS_USE_BUCKET_POLICY = "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy"


def deliver_access_logs_by_bucket_policy(scope: Construct) -> None:
    """Buckets under `scope` receive server access logs through their bucket policy, whatever the
    app's feature flags (context set on `scope` alone, before it has children)."""
    scope.node.set_context(SERVER_ACCESS_LOGS_USE_BUCKET_POLICY, True)


#: Regions launched after August 2022 deliver ALB access logs as this service principal; older
#: ones as Elastic Load Balancing's account of the region (RegionInfo's elbv2Account).
ELB_LOG_DELIVERY_PRINCIPAL = "logdelivery.elasticloadbalancing.amazonaws.com"


def log_access(load_balancer: elbv2.ApplicationLoadBalancer, bucket: s3.IBucket,
               prefix: str) -> None:
    """The load balancer's access logs into `bucket` under `prefix`.

    With the stack's region known this is CDK's `log_access_logs`. An environment-agnostic stack
    (the README's offline `npx cdk synth`: no account, no region) has no region to pick the
    delivering principal by, where CDK fails (RegionRequiredEnableBvAccess); here the bucket
    policy picks it at deploy time instead: Elastic Load Balancing's account of the region
    (a CloudFormation mapping of RegionInfo's accounts, under a condition that the region is
    one of them), and the log-delivery service principal of the newer regions. Same
    attributes, same objects (`<prefix>/AWSLogs/<account>/*`)."""
    stack = Stack.of(load_balancer)
    if not Token.is_unresolved(stack.region):
        load_balancer.log_access_logs(bucket, prefix=prefix)
        return
    load_balancer.set_attribute("access_logs.s3.enabled", "true")
    load_balancer.set_attribute("access_logs.s3.bucket", bucket.bucket_name)
    load_balancer.set_attribute("access_logs.s3.prefix", prefix)
    objects = bucket.arn_for_objects(f"{prefix}/AWSLogs/{Aws.ACCOUNT_ID}/*")
    mapping, legacy = _elb_accounts(stack)
    elb_account = Fn.condition_if(
        legacy.logical_id,
        f"arn:{Aws.PARTITION}:iam::{mapping.find_in_map(Aws.REGION, 'account')}:root",
        # a newer region: nobody more than the bucket owner (the service principal delivers)
        f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:root").to_string()
    for principal in (iam.ArnPrincipal(elb_account),
                      iam.ServicePrincipal(ELB_LOG_DELIVERY_PRINCIPAL)):
        bucket.add_to_resource_policy(iam.PolicyStatement(
            actions=["s3:PutObject"], principals=[principal], resources=[objects]))
    delivery = iam.ServicePrincipal("delivery.logs.amazonaws.com")
    bucket.add_to_resource_policy(iam.PolicyStatement(
        actions=["s3:PutObject"], principals=[delivery], resources=[objects],
        conditions={"StringEquals": {"s3:x-amz-acl": "bucket-owner-full-control"}}))
    bucket.add_to_resource_policy(iam.PolicyStatement(
        actions=["s3:GetBucketAcl"], principals=[delivery], resources=[bucket.bucket_arn]))
    if bucket.policy is not None:
        load_balancer.node.add_dependency(bucket.policy)


def _elb_accounts(stack: Stack) -> tuple[CfnMapping, CfnCondition]:
    """The stack's mapping region -> Elastic Load Balancing's account, and the condition that
    the deploying region is in it (made once per stack)."""
    found = stack.node.try_find_child("ElbLogDeliveryAccounts")
    if isinstance(found, CfnMapping):
        condition = stack.node.find_child("ElbLogDeliveryByAccount")
        assert isinstance(condition, CfnCondition)
        return found, condition
    accounts = {region.name: region.elbv2_account for region in RegionInfo.regions
                if region.elbv2_account}
    mapping = CfnMapping(stack, "ElbLogDeliveryAccounts", mapping={
        name: {"account": account} for name, account in sorted(accounts.items())})
    equals: list[ICfnConditionExpression] = [
        Fn.condition_equals(Aws.REGION, name) for name in sorted(accounts)]
    # Fn::Or takes 2 to 10 conditions
    chunks = [equals[start:start + 10] for start in range(0, len(equals), 10)]
    groups = [chunk[0] if len(chunk) == 1 else Fn.condition_or(*chunk) for chunk in chunks]
    condition = CfnCondition(stack, "ElbLogDeliveryByAccount",
                             expression=Fn.condition_or(*groups) if len(groups) > 1
                             else groups[0])
    return mapping, condition


class Foundation(Construct):
    """The platform key (rotation on, SNS may use it) and the offload bucket (SSE-KMS, TLS only).

    namespace: physical name prefix ('' for none).
    removal_policy: of key and buckets (default RETAIN: deleting the stack must not lose data).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        namespace: str,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        deliver_access_logs_by_bucket_policy(self)
        stack = Stack.of(self)
        self.key = kms.Key(
            self,
            "Key",
            alias=platform_key_alias(namespace),
            description=f"messenger platform key ({namespace or 'default'})",
            enable_key_rotation=True,
            removal_policy=removal_policy,
        )
        # SNS encrypts the copy it delivers to an encrypted queue with this key. In a key policy
        # "Resource": "*" means this key.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="SnsDeliversToEncryptedQueues",
                principals=[iam.ServicePrincipal("sns.amazonaws.com")],
                actions=["kms:GenerateDataKey*", "kms:Decrypt"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(ACCESS_LOG_EXPIRY_DAYS))],
            removal_policy=removal_policy,
        )
        # Named from the pseudo parameter, not a cross-stack export: grants in other stacks
        # build the same ARN from the name.
        self.offload_bucket_name = offload_bucket_name(namespace, Aws.ACCOUNT_ID, Aws.REGION)
        self.offload_bucket = s3.Bucket(
            self,
            "OffloadBucket",
            bucket_name=self.offload_bucket_name,
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="offload/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-offloaded-payloads",
                    prefix=OFFLOAD_PREFIX,
                    expiration=Duration.days(OFFLOAD_EXPIRY_DAYS),
                )
            ],
            removal_policy=removal_policy,
        )
        # Lifecycle records of channels with track_status (messenger.jobs.status); expire by TTL.
        self.status_table = dynamodb.Table(
            self,
            "StatusTable",
            table_name=status_table_name(namespace),
            partition_key=dynamodb.Attribute(name="message_id", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="sk", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED,
            encryption_key=self.key,
            time_to_live_attribute="expires_at",
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=removal_policy,
        )
        # Enqueue-dedup claims (messenger.jobs.dedup) and the consumer-process registry
        # (messenger.jobs.workers): small, short-lived items that expire by TTL.
        self.dedup_table = self._ttl_table("DedupTable", dedup_table_name(namespace),
                                           "dedup_key", None, removal_policy)
        self.workers_table = self._ttl_table("WorkersTable", workers_table_name(namespace),
                                             "channel", "worker_id", removal_policy)
        # Idempotent handlers' records (messenger.consume.idempotency, Powertools' layout).
        self.idempotency_table = self._ttl_table(
            "IdempotencyTable", idempotency_table_name(namespace), "id", None, removal_policy)
        # Flow control (messenger.jobs.limits): run-time limits, token buckets, concurrency
        # leases; grants by channel in stacks.flow_control.
        self.limits_table = self._ttl_table(
            "LimitsTable", limits_table_name(namespace), "key", None, removal_policy)
        # Held jobs and groups (messenger.jobs.workflows): one item per `job#<id>` or
        # `group#<id>`; the sparse "open" index holds only those not settled, for the sweeper.
        self.namespace = namespace
        self.workflows_table = self._ttl_table(
            "WorkflowsTable", workflows_table_name(namespace), "id", None, removal_policy)
        self.workflows_table.add_global_secondary_index(
            index_name=WORKFLOWS_OPEN_INDEX,
            partition_key=dynamodb.Attribute(name="open_shard",
                                             type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="created_at", type=dynamodb.AttributeType.NUMBER),
            projection_type=dynamodb.ProjectionType.ALL,
        )
        # A team's producer roles that push with depends_on, push a group or read results
        # attach this (`grant_workflow_producer`); the CDK app's own producers get statements.
        self.workflow_producer_policy = iam.ManagedPolicy(
            self, "WorkflowProducerPolicy",
            managed_policy_name=f"{namespace}-messenger-workflow-producers" if namespace
            else "messenger-workflow-producers",
            description="hold jobs until their dependencies are final, push groups, read "
                        "results (messenger.jobs.workflows, Producer.result)",
            statements=self._workflow_producer_statements())
        acknowledge_wildcard_resource(
            self.workflow_producer_policy, self.payload_objects_arn,
            "A result above 350 KB is an offloaded object with a random key made at run time; "
            "the grant reads objects under the payloads/ prefix of the platform bucket only.")
        Tags.of(self).add(TAG_MANAGED, "true")
        if namespace:
            Tags.of(self).add(TAG_NAMESPACE, namespace)

    def _ttl_table(self, id: str, name: str, partition: str, sort: str | None,
                   removal_policy: RemovalPolicy) -> dynamodb.Table:
        return dynamodb.Table(
            self, id, table_name=name,
            partition_key=dynamodb.Attribute(name=partition, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=sort, type=dynamodb.AttributeType.STRING)
            if sort else None,
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED, encryption_key=self.key,
            time_to_live_attribute="expires_at",
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=removal_policy,
        )

    def grant_status_write(self, grantee: iam.IGrantable) -> None:
        """Record message status (`jobs.status.StatusStore`): check the table, write batches."""
        self._grant_table(grantee, self.status_table,
                          "dynamodb:BatchWriteItem", "dynamodb:PutItem")

    def grant_dedup(self, grantee: iam.IGrantable) -> None:
        """Push with dedup on (`jobs.dedup.DedupStore`): conditional claims, released again
        when a send fails, marked sent after it (one PutItem, or BatchWriteItem in push_many)."""
        self._grant_table(grantee, self.dedup_table, "dynamodb:PutItem", "dynamodb:DeleteItem",
                          "dynamodb:BatchWriteItem")

    def grant_fired_claims(self, grantee: iam.IGrantable) -> None:
        """Run each job the scheduler fired once (`jobs.fired.FiringClaims`, every consumer: any
        channel may get scheduled jobs): put and delete only the dedup table's items whose key
        starts with FIRED_CLAIM_PREFIX (never a producer's dedup claim), and check the table."""
        iam.Grant.add_to_principal(grantee=grantee, actions=["dynamodb:DescribeTable"],
                                   resource_arns=[self.dedup_table.table_arn])
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=["dynamodb:PutItem", "dynamodb:DeleteItem"],
            resources=[self.dedup_table.table_arn],
            conditions={"ForAllValues:StringLike": {
                "dynamodb:LeadingKeys": [f"{FIRED_CLAIM_PREFIX}*"]}}))
        self.key.grant(grantee, "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")

    def grant_workers_write(self, grantee: iam.IGrantable) -> None:
        """Register a consumer process (`jobs.workers.WorkerRegistry`): write its entry,
        delete it at exit; and act on cancel requests (`grant_cancel_requests`)."""
        self._grant_table(grantee, self.workers_table, "dynamodb:PutItem", "dynamodb:DeleteItem",
                          "dynamodb:Query")

    def grant_cancel_requests(self, grantee: iam.IGrantable) -> None:
        """Act on operators' cancel requests (`jobs.controls.CancelRequests`, in the worker
        registry's table): read its channel's requests and delete those it acted on. A Lambda
        consumer gets only this (it registers no entry)."""
        self._grant_table(grantee, self.workers_table, "dynamodb:Query", "dynamodb:DeleteItem")

    def grant_idempotency(self, grantee: iam.IGrantable) -> None:
        """Run idempotent handlers (`consume.idempotency`, Powertools): conditional put of the
        in-progress record, read it back, mark it completed, delete it when the handler failed."""
        self._grant_table(grantee, self.idempotency_table, "dynamodb:PutItem",
                          "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")

    def grant_workflows(self, grantee: iam.IGrantable, *, releases: bool = True,
                        results: bool = False) -> None:
        """Run workflows (`jobs.workflows.Workflows`: a producer's `depends_on` and `group`, a
        consumer advancing what waits on a job, an operator's final action, the sweeper): the
        workflows table's items, final outcomes (a held job cancelled because its dependency
        failed is settled CANCELLED), and the release of a held job:
        a send to its queue or topic, which may be any channel of the namespace (named by the
        namespace's tags: queues and topics are made at run time too; with the read of their
        channel's declarations, as any producer's).

        releases: False for a role that releases only jobs of its own channels (the HTTP API:
        it holds jobs it was posted, on its channels, and releases one at once when its
        dependencies are final already; its channels' publish grants cover that send).
        results: the role writes results (a consumer of a channel that keeps them): one too
        large for its item is an offloaded object (`grant_offload_write`). Whoever releases a
        job reads its dependencies' results, large ones from the bucket."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["dynamodb:DescribeTable", *WORKFLOWS_TABLE_ACTIONS],
            resource_arns=[self.workflows_table_arn])
        # final outcomes on the status table (its `~final` items, `jobs.results.ResultStore`:
        # IAM tells partition keys apart, not sort keys)
        self._grant_table(grantee, self.status_table, *RESULT_ACTIONS)
        self.grant_offload_read(grantee)
        if results:
            self.grant_offload_write(grantee)
        # a push with depends_on reads each dependency's status records (its channel must keep
        # results); the sweeper whether a group's member reached its queue; a release records
        # the released job QUEUED (on a channel that tracks status)
        self._grant_table(grantee, self.status_table, "dynamodb:Query")
        self.grant_status_write(grantee)
        principal = grantee.grant_principal
        if not releases:
            return
        policy = principal.node.try_find_child("DefaultPolicy") \
            if isinstance(principal, iam.Role) else None
        for service, actions, role in (
                ("sqs", ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes",
                         "sqs:ListQueueTags"], "queue"),
                ("sns", ["sns:Publish", "sns:GetTopicAttributes"], "topic")):
            principal.add_to_principal_policy(iam.PolicyStatement(
                actions=actions, resources=[any_name(service)],
                conditions=ownership_condition(self.namespace, role)))
        if policy is not None:
            for service in ("sqs", "sns"):
                acknowledge_wildcard_resource(policy, any_name(service),
                                              ownership_reason(self.namespace))

    def _workflow_producer_statements(self) -> list[iam.PolicyStatement]:
        """What a producer's `push(depends_on=...)`, `group` and `result` call: the workflows
        table's items (hold, mark a group sent, apply a dependency final already), the status
        table's final items and records (register on a dependency, read outcomes, the
        dependency check's Query, a released job's QUEUED), large results, the key. A job it
        releases goes to its own channel (its publish grant)."""
        status = self.status_table.table_arn
        return [
            iam.PolicyStatement(actions=["dynamodb:DescribeTable", *WORKFLOWS_TABLE_ACTIONS],
                                resources=[self.workflows_table_arn]),
            iam.PolicyStatement(actions=["dynamodb:DescribeTable", *RESULT_ACTIONS,
                                         "dynamodb:Query", "dynamodb:BatchWriteItem",
                                         "dynamodb:PutItem"], resources=[status]),
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[self.payload_objects_arn]),
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.offload_bucket_arn]),
            iam.PolicyStatement(actions=["kms:Decrypt", "kms:GenerateDataKey",
                                         "kms:DescribeKey"], resources=[self.key.key_arn]),
        ]

    def grant_workflow_producer(self, role: iam.IRole) -> None:
        """Let a producer's `role` push jobs that wait (`depends_on`), push groups and read
        results: the managed policy `<ns->messenger-workflow-producers`."""
        role.add_managed_policy(self.workflow_producer_policy)

    def grant_workflows_sweep(self, grantee: iam.IGrantable) -> None:
        """Sweep the workflows (`Workflows.sweep`, the 15-minute operations run): what runs
        workflows (`grant_workflows`) and the Query of the table's open index."""
        self.grant_workflows(grantee)
        index = f"{self.workflows_table_arn}/index/{WORKFLOWS_OPEN_INDEX}"
        iam.Grant.add_to_principal(grantee=grantee, actions=["dynamodb:Query"],
                                   resource_arns=[index])

    def _grant_table(self, grantee: iam.IGrantable, table: dynamodb.Table, *actions: str) -> None:
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["dynamodb:DescribeTable", *actions],
            resource_arns=[table.table_arn],
        )
        self.key.grant(grantee, "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")

    @property
    def workflows_table_arn(self) -> str:
        """The workflows table's ARN built from its name, as a grant in any stack of the
        platform's environment names it (no cross-stack export)."""
        return (f"arn:{Aws.PARTITION}:dynamodb:{Aws.REGION}:{Aws.ACCOUNT_ID}:table/"
                f"{workflows_table_name(self.namespace)}")

    @property
    def offload_bucket_arn(self) -> str:
        return f"arn:{Aws.PARTITION}:s3:::{self.offload_bucket_name}"

    @property
    def payload_objects_arn(self) -> str:
        return f"{self.offload_bucket_arn}/{OFFLOAD_PREFIX}*"

    def grant_offload_read(self, grantee: iam.IGrantable) -> None:
        """Read offloaded payloads (consumers) and check the bucket exists (HeadBucket)."""
        self._grant_offload(grantee, "s3:GetObject", "kms:Decrypt")

    def grant_offload_write(self, grantee: iam.IGrantable) -> None:
        """Write offloaded payloads (producers) and check the bucket exists (HeadBucket)."""
        self._grant_offload(grantee, "s3:PutObject", "kms:GenerateDataKey")

    def _grant_offload(self, grantee: iam.IGrantable, object_action: str, key_action: str) -> None:
        iam.Grant.add_to_principal(
            grantee=grantee, actions=[object_action], resource_arns=[self.payload_objects_arn]
        )
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["s3:ListBucket"],
            resource_arns=[self.offload_bucket_arn],
        )
        self.key.grant(grantee, key_action)
        principal = grantee.grant_principal
        if isinstance(principal, iam.Role):
            policy = principal.node.try_find_child("DefaultPolicy")
            if policy is not None:
                acknowledge_wildcard_resource(
                    policy, self.payload_objects_arn,
                    "Offloaded payloads get random keys at run time; the grant is one object "
                    "action under the payloads/ prefix of the platform bucket.",
                )
