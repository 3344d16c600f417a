"""`ConsumerService`: one consumer class running on ECS Fargate, scaled on its queue's depth."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jsii
from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_applicationautoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct, IValidation

from stacks.channel import Channel
from stacks.foundation import Foundation
from stacks.nag import acknowledge

#: Container health check (ECS limits: interval 5-300 s, timeout 2-120 s, retries 1-10,
#: start period 0-300 s): the consumer may take up to five minutes to initialize.
HEALTH_CHECK = ecs.HealthCheck(
    command=["CMD", "check_consumer_health"],
    interval=Duration.seconds(30),
    timeout=Duration.seconds(10),
    retries=5,
    start_period=Duration.seconds(300),
)
#: Fargate allows a stop timeout of at most 120 seconds between SIGTERM and SIGKILL.
FARGATE_MAX_STOP_TIMEOUT_SECONDS = 120
DEFAULT_STOP_TIMEOUT = Duration.seconds(FARGATE_MAX_STOP_TIMEOUT_SECONDS)
#: MESSENGER_SHUTDOWN_TIMEOUT: in-flight work gets 30 s after SIGTERM (the consumer's default).
DEFAULT_SHUTDOWN_TIMEOUT = Duration.seconds(30)
#: The `Consumer.processing_timeout` default.
DEFAULT_PROCESSING_TIMEOUT = Duration.seconds(60)
#: Like `QueueProcessingFargateService`: one task fewer at an empty queue, one more from 100
#: visible messages, five more from 500.
DEFAULT_SCALING_STEPS = (
    autoscaling.ScalingInterval(upper=0, change=-1),
    autoscaling.ScalingInterval(lower=100, change=+1),
    autoscaling.ScalingInterval(lower=500, change=+5),
)


class ConsumerService(Construct):
    """A Fargate service running `messenger consume <consumer_class>` on one channel.

    channel: the channel it consumes (grants: consume the queue, forward to the DLQ, the key).
    foundation: the platform key and offload bucket (grants: read offloaded payloads).
    cluster: the ECS cluster (its VPC's public subnets are used unless `subnets` is given).
    image: the consumer image (built from `consumer_image/Dockerfile`).
    consumer_class: 'package.module:Class'.
    namespace: MESSENGER_NAMESPACE of the container.
    processing_timeout: the consumer's per-message processing limit; must not exceed the
        channel's visibility timeout, or SQS redelivers messages still being processed.
    concurrency: MESSENGER_CONCURRENCY, messages processed in parallel per task (default 1).
    shutdown_timeout: seconds the consumer gets to finish in-flight work after SIGTERM (30).
    stop_timeout: seconds ECS waits after SIGTERM before SIGKILL; above `shutdown_timeout`,
        at most 120 (default 120).
    cpu / memory_mib: Fargate task size (256 / 512).
    min_tasks / max_tasks: scaling bounds on queue depth (1 / 10).
    scaling_steps: step scaling on ApproximateNumberOfMessagesVisible (default: -1 at 0,
        +1 from 100, +5 from 500).
    environment: extra environment variables (no secrets: they are visible in the task definition).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        channel: Channel,
        foundation: Foundation,
        cluster: ecs.ICluster,
        image: ecs.ContainerImage,
        consumer_class: str,
        namespace: str,
        processing_timeout: Duration = DEFAULT_PROCESSING_TIMEOUT,
        concurrency: int = 1,
        shutdown_timeout: Duration = DEFAULT_SHUTDOWN_TIMEOUT,
        stop_timeout: Duration = DEFAULT_STOP_TIMEOUT,
        cpu: int = 256,
        memory_mib: int = 512,
        min_tasks: int = 1,
        max_tasks: int = 10,
        scaling_steps: Sequence[autoscaling.ScalingInterval] = DEFAULT_SCALING_STEPS,
        subnets: ec2.SubnetSelection | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(scope, id)
        if ":" not in consumer_class:
            raise ValueError(
                f"ConsumerService {id!r}: consumer_class must be 'package.module:Class', "
                f"got {consumer_class!r}"
            )
        if concurrency < 1:
            raise ValueError(f"ConsumerService {id!r}: concurrency must be >= 1, got {concurrency}")
        self.channel = channel
        self.consumer_class = consumer_class
        self.processing_timeout = processing_timeout
        self.shutdown_timeout = shutdown_timeout
        self.stop_timeout = stop_timeout
        self.node.add_validation(_TimeoutValidation(self))

        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.task_definition = ecs.FargateTaskDefinition(
            self,
            "Task",
            cpu=cpu,
            memory_limit_mib=memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.X86_64,
                operating_system_family=ecs.OperatingSystemFamily.LINUX,
            ),
        )
        self.environment = {
            "MESSENGER_PROVISIONING": "verify",
            "MESSENGER_NAMESPACE": namespace,
            "MESSENGER_KMS_KEY": foundation.key.key_arn,
            "MESSENGER_OFFLOAD_BUCKET": foundation.offload_bucket_name,
            "MESSENGER_SHUTDOWN_TIMEOUT": str(shutdown_timeout.to_seconds()),
            "MESSENGER_CONCURRENCY": str(concurrency),
            "AWS_REGION": Stack.of(self).region,
            **(environment or {}),
        }
        self.container = self.task_definition.add_container(
            "Consumer",
            image=image,
            command=["messenger", "consume", consumer_class],
            environment=self.environment,
            health_check=HEALTH_CHECK,
            stop_timeout=stop_timeout,
            logging=ecs.LogDrivers.aws_logs(stream_prefix="consumer", log_group=self.log_group),
            readonly_root_filesystem=False,
        )
        channel.grant_consume(self.task_definition.task_role)
        foundation.grant_offload_read(self.task_definition.task_role)
        if any(level.spec.track_status for level in channel.levels):
            foundation.grant_status_write(self.task_definition.task_role)

        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=cluster.vpc,
            description=f"consumer {consumer_class}: no inbound traffic, HTTPS out to AWS APIs",
            allow_all_outbound=False,
        )
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "AWS APIs (SQS, SNS, S3, KMS, ECR, Logs)"
        )
        self.service = ecs.FargateService(
            self,
            "Service",
            cluster=cluster,
            task_definition=self.task_definition,
            desired_count=min_tasks,
            min_healthy_percent=100,
            max_healthy_percent=200,
            circuit_breaker=ecs.DeploymentCircuitBreaker(rollback=True),
            assign_public_ip=subnets is None,
            vpc_subnets=subnets or ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            security_groups=[self.security_group],
        )
        self.scaling = self.service.auto_scale_task_count(
            min_capacity=min_tasks, max_capacity=max_tasks
        )
        self.scaling.scale_on_metric(
            "QueueDepth",
            metric=_visible_messages(channel),
            scaling_steps=list(scaling_steps),
            adjustment_type=autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            cooldown=Duration.minutes(2),
        )

        acknowledge(
            self.task_definition,
            "AwsSolutions-ECS2",
            "The environment holds only resource names, the key ARN and tuning numbers, no "
            "secrets; the consumer reads its settings from the environment by design.",
        )
        execution_policy = self.task_definition.obtain_execution_role().node.try_find_child(
            "DefaultPolicy"
        )
        if execution_policy is not None:
            acknowledge(
                execution_policy,
                "AwsSolutions-IAM5[Resource::*]",
                "ecr:GetAuthorizationToken has no resource scope in IAM; pulling the image "
                "itself is limited to the asset repository.",
            )

    @property
    def task_role(self) -> iam.IRole:
        return self.task_definition.task_role


def _visible_messages(channel: Channel) -> cloudwatch.IMetric:
    """Visible messages of the channel: its queue's, or the sum over its priority levels."""
    metrics = [
        queue.metric_approximate_number_of_messages_visible(
            period=Duration.minutes(1), statistic="Maximum"
        )
        for queue in channel.queues
    ]
    if len(metrics) == 1:
        return metrics[0]
    names = {f"m{i}": metric for i, metric in enumerate(metrics)}
    return cloudwatch.MathExpression(
        expression=" + ".join(names), using_metrics=names, label="visible (all levels)",
        period=Duration.minutes(1),
    )


@jsii.implements(IValidation)
class _TimeoutValidation:
    """Processing must fit in the visibility timeout, shutdown in the stop timeout."""

    def __init__(self, service: ConsumerService) -> None:
        self.service = service

    def validate(self) -> list[str]:
        service = self.service
        spec = service.channel.spec
        errors = []
        processing = service.processing_timeout.to_seconds()
        if spec.visibility_timeout < processing:
            errors.append(
                f"consumer {service.consumer_class!r} on channel {spec.name!r}: the channel's "
                f"visibility_timeout ({spec.visibility_timeout} s) is shorter than the consumer's "
                f"processing_timeout ({processing:g} s); SQS would redeliver messages still being "
                f"processed. Raise ChannelSpec.visibility_timeout to at least {processing:g}."
            )
        stop = service.stop_timeout.to_seconds()
        shutdown = service.shutdown_timeout.to_seconds()
        if not shutdown < stop <= FARGATE_MAX_STOP_TIMEOUT_SECONDS:
            errors.append(
                f"consumer {service.consumer_class!r}: stop_timeout ({stop:g} s) must be above "
                f"shutdown_timeout ({shutdown:g} s) and at most "
                f"{FARGATE_MAX_STOP_TIMEOUT_SECONDS} s"
            )
        return errors
