"""`PipelineStack`: the EMR pipeline that runs `spark_jobs/` and publishes to channels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import CfnOutput, Stack, Tags
from constructs import Construct

from messenger.channel import TAG_MANAGED
from stacks.channel import Channel
from stacks.emr_pipeline import EMR_MANAGED_TAG, EmrPipeline
from stacks.platform_stack import PlatformStack


class PipelineStack(Stack):
    """Code bucket, job assets, EMR roles and the run-a-job state machine.

    platform: the namespace's PlatformStack. channels: what the jobs publish to.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        platform: PlatformStack,
        channels: Sequence[Channel],
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, id, **kwargs)
        # The jobs name their channels' topics and queues by ARN, built from the channel names
        # (no export ties this stack to theirs); theirs deploy first.
        owners = {Stack.of(channel).node.path: Stack.of(channel) for channel in channels}
        for stack in owners.values():
            if stack.node.path != self.node.path:
                self.add_stack_dependency(stack, "the jobs publish to its channels")
        # EMR's managed service policy acts only on subnets and security groups with this tag.
        Tags.of(platform.vpc).add(EMR_MANAGED_TAG, "true")
        self.pipeline = EmrPipeline(
            self, "Emr", foundation=platform.foundation, vpc=platform.vpc, channels=channels,
            namespace=platform.namespace,
        )
        CfnOutput(self, "CodeBucketName", value=self.pipeline.code_bucket.bucket_name)
        CfnOutput(self, "JobRoleArn", value=self.pipeline.job_role.role_arn)
        CfnOutput(self, "InstanceProfileName", value=self.pipeline.job_role.role_name)
        CfnOutput(self, "ServiceRoleName", value=self.pipeline.service_role.role_name)
        if self.pipeline.state_machine is not None:
            CfnOutput(self, "StateMachineArn",
                      value=self.pipeline.state_machine.state_machine_arn)
        Tags.of(self).add(TAG_MANAGED, "true")
