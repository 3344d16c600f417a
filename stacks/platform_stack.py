"""`PlatformStack`: what every channel stack of a namespace shares.

The platform key and offload bucket, the network and ECS cluster consumers run in, and the
scheduled operations Lambdas. It holds no resource detail: the constructs do.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Environment, Fn, RemovalPolicy, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_logs as logs
from constructs import Construct

from messenger.channel import TAG_MANAGED, TAG_NAMESPACE
from stacks.config import MessengerConfig
from stacks.dashboard_service import DashboardService
from stacks.flow_control import LimitOperators
from stacks.foundation import Foundation
from stacks.ops import OpsFunctions
from stacks.schedules import ScheduleWiring


class PlatformStack(Stack):
    """Key, offload bucket, VPC + ECS cluster and ops Lambdas of one namespace.

    Consumer images belong to the channel stacks (`ChannelStack(code=...)`): each team's code."""

    def __init__(
        self, scope: Construct, id: str, *, config: MessengerConfig, **kwargs: Any
    ) -> None:
        super().__init__(scope, id, **kwargs)
        #: Where the platform deploys; its channel stacks deploy there too.
        self.deploy_env: Environment | None = kwargs.get("env")
        self.config = config
        self.namespace = config.namespace
        self.foundation = Foundation(self, "Foundation", namespace=config.namespace)

        flow_logs = logs.LogGroup(
            self, "FlowLogs", retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # Public subnets only, no NAT gateway: consumers need outbound HTTPS to AWS APIs and
        # accept no inbound traffic (their security groups allow none).
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=2,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC,
                                        cidr_mask=24)
            ],
            flow_logs={
                "all": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs)
                )
            },
        )
        # Container Insights publishes RunningTaskCount (backlog-per-task scaling); the Fargate
        # capacity providers let a consumer run on Spot (`ConsumerService(capacity="spot")`).
        self.cluster = ecs.Cluster(
            self, "Cluster", vpc=self.vpc, container_insights_v2=ecs.ContainerInsights.ENABLED,
            enable_fargate_capacity_providers=True,
        )
        self.ops = OpsFunctions(
            self,
            "Ops",
            namespace=config.namespace,
            slack_webhook_secret=config.slack_webhook_secret,
            alarm_threshold=config.alarm_threshold,
            cleaner_dry_run=config.cleaner_dry_run,
            critical_mention=config.critical_mention,
            key=self.foundation.key,
        )
        # The 15-minute run also sweeps the workflows (jobs.workflows.Workflows.sweep): groups
        # whose producer stopped, held jobs whose dependencies never finished.
        self.foundation.grant_workflows_sweep(self.ops.queue_alarm)
        #: Scheduled jobs: the namespace's schedule group, DLQ and scheduler role.
        self.schedules = ScheduleWiring(self, "Schedules", namespace=config.namespace,
                                        key=self.foundation.key)
        #: `messenger limits` for operators: attach `.policy` (flow control, docs/flow-control.md).
        self.limit_operators = LimitOperators(self, "LimitOperators", namespace=config.namespace,
                                              key=self.foundation.key)
        CfnOutput(self, "OpsAlarmTopicArn", value=self.ops.alarm_topic.topic_arn)
        CfnOutput(self, "KeyArn", value=self.foundation.key.key_arn)
        CfnOutput(self, "OffloadBucketName", value=self.foundation.offload_bucket.bucket_name)
        Tags.of(self).add(TAG_MANAGED, "true")
        if config.namespace:
            Tags.of(self).add(TAG_NAMESPACE, config.namespace)

    def add_dashboard(self, id: str = "Dashboard", **options: Any) -> DashboardService:
        """The team dashboard of this namespace behind a login (`DashboardService`: certificate=,
        domain_name=, login=CognitoLogin(...) or OidcLogin(...), operator_groups=, ...)."""
        return DashboardService(self, id, foundation=self.foundation, vpc=self.vpc,
                                namespace=self.namespace, **options)

    @property
    def availability_zones(self) -> list[str]:
        """Two AZs resolved at deploy time (Fn::GetAZs), as for an environment-agnostic stack:
        synthesis never looks AZs up, so it needs no credentials even with account/region set."""
        return [Fn.select(0, Fn.get_azs()), Fn.select(1, Fn.get_azs())]
