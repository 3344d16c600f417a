"""`EmrPipeline`: what EMR needs to run `spark_jobs/`, and a state machine that runs one job.

The state machine runs a job on a transient cluster: check the job name, create the cluster,
add one `spark-submit` step (the job script and the packaged `messenger` library are S3 assets),
terminate the cluster whether the step succeeded or not. Input:
`{"job": "<spark_jobs/ file name without .py>", "args": ["--flag", "value", ...]}`.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Aws, Duration, RemovalPolicy, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from stacks.bundle import library_bundle, spark_job_scripts
from stacks.channel import Channel
from stacks.foundation import Foundation
from stacks.nag import acknowledge, acknowledge_wildcard_resource

DEFAULT_RELEASE_LABEL = "emr-7.9.0"
#: EMR's managed service policy (v2) only acts on network resources carrying this tag.
EMR_MANAGED_TAG = "for-use-with-amazon-emr-managed-policies"
#: Tag of the clusters the state machine creates (value: the pipeline's construct path); it may
#: terminate no other cluster.
PIPELINE_TAG = "messenger:pipeline"
#: Prefix of the code bucket where jobs may read and write their data.
DATA_PREFIX = "data/"
#: Where `messenger emr submit` uploads code (`messenger.tools.emr.CODE_PREFIX`); only uploaded
#: code expires, never the jobs' input and output under `data/`.
CODE_UPLOAD_PREFIX = "emr/"
CODE_EXPIRY = Duration.days(30)
MANAGED_POLICIES = {
    "ServiceRole": "service-role/AmazonEMRServicePolicy_v2",
    "AutoScalingRole": "service-role/AmazonElasticMapReduceforAutoScalingRole",
}


class EmrPipeline(Construct):
    """Code bucket, library/job assets, EMR roles and the run-a-job state machine.

    foundation: platform key and offload bucket (jobs may offload large payloads).
    vpc: where the transient cluster runs (its first public subnet).
    channels: channels the jobs publish to (grant_publish on each, plus the key).
    namespace: MESSENGER_NAMESPACE of the Spark driver and executors.
    release_label: EMR release (default emr-7.9.0: Spark 3.5, Python 3).
    instance_type / core_instances: cluster size (m5.xlarge, 2 core nodes).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        foundation: Foundation,
        vpc: ec2.IVpc,
        channels: Sequence[Channel],
        namespace: str,
        release_label: str = DEFAULT_RELEASE_LABEL,
        instance_type: str = "m5.xlarge",
        core_instances: int = 2,
    ) -> None:
        super().__init__(scope, id)
        self.logs_bucket = s3.Bucket(
            self, "Logs", encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL, enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(90))],
            removal_policy=RemovalPolicy.RETAIN,
        )
        # What `messenger emr submit` uploads (library + script) for steps on a running cluster.
        self.code_bucket = s3.Bucket(
            self, "Code", encryption=s3.BucketEncryption.KMS, encryption_key=foundation.key,
            bucket_key_enabled=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True, server_access_logs_bucket=self.logs_bucket,
            server_access_logs_prefix="code-access/",
            lifecycle_rules=[
                s3.LifecycleRule(prefix=CODE_UPLOAD_PREFIX, expiration=CODE_EXPIRY),
                # Failed multipart uploads anywhere (a killed job's output) cost storage only.
                s3.LifecycleRule(abort_incomplete_multipart_upload_after=Duration.days(7)),
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.library = s3_assets.Asset(self, "Library", path=str(library_bundle()))
        self.jobs = {
            script.stem: s3_assets.Asset(self, f"Job{_camel(script.stem)}", path=str(script))
            for script in spark_job_scripts()
        }

        self.job_role = iam.Role(
            self, "JobRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="EMR cluster nodes (instance profile): run messenger Spark jobs",
        )
        self.instance_profile = iam.CfnInstanceProfile(
            self, "InstanceProfile", roles=[self.job_role.role_name],
            instance_profile_name=self.job_role.role_name,
        )
        for channel in channels:
            channel.grant_publish(self.job_role)
            if channel.spec.track_status:
                foundation.grant_status_write(self.job_role)
        foundation.grant_offload_write(self.job_role)
        # Verify mode (DescribeKey), and reading/writing the code bucket (SSE-KMS, the CMK).
        foundation.key.grant(
            self.job_role, "kms:DescribeKey", "kms:Decrypt", "kms:GenerateDataKey"
        )
        readable = [self.library.bucket.arn_for_objects(self.library.s3_object_key)]
        readable += [a.bucket.arn_for_objects(a.s3_object_key) for a in self.jobs.values()]
        readable.append(self.code_bucket.arn_for_objects("*"))
        self.job_role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"],
                                                        resources=readable))
        # Job input and output (e.g. --input / --failed-output) under data/ of the code bucket;
        # grant `job_role` more for other buckets.
        self.job_role.add_to_policy(iam.PolicyStatement(
            actions=["s3:PutObject", "s3:DeleteObject"],
            resources=[self.code_bucket.arn_for_objects(f"{DATA_PREFIX}*")],
        ))
        self.job_role.add_to_policy(iam.PolicyStatement(
            actions=["s3:ListBucket"], resources=[self.code_bucket.bucket_arn]
        ))
        self.job_role.add_to_policy(iam.PolicyStatement(
            actions=["s3:PutObject"], resources=[self.logs_bucket.arn_for_objects("emr/*")]
        ))

        self.service_role = iam.Role(
            self, "ServiceRole", assumed_by=iam.ServicePrincipal("elasticmapreduce.amazonaws.com"),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
                MANAGED_POLICIES["ServiceRole"])],
        )
        # The managed policy may pass only EMR_EC2_DefaultRole; ours has another name.
        self.service_role.add_to_policy(iam.PolicyStatement(
            actions=["iam:PassRole"], resources=[self.job_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
        ))
        self.autoscaling_role = iam.Role(
            self, "AutoScalingRole",
            assumed_by=iam.CompositePrincipal(
                iam.ServicePrincipal("elasticmapreduce.amazonaws.com"),
                iam.ServicePrincipal("application-autoscaling.amazonaws.com"),
            ),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
                MANAGED_POLICIES["AutoScalingRole"])],
        )
        self.subnet_id = vpc.public_subnets[0].subnet_id
        self.state_machine = self._state_machine(
            foundation, namespace, release_label, instance_type, core_instances
        ) if self.jobs else None
        self._acknowledge()

    # -- the state machine --------------------------------------------------------------------
    def spark_submit_args(self, foundation: Foundation, namespace: str) -> list[str]:
        """The fixed part of the step: spark-submit, the library, the driver/executor settings."""
        env = {
            "MESSENGER_NAMESPACE": namespace,
            "MESSENGER_PROVISIONING": "verify",
            "MESSENGER_KMS_KEY": foundation.key.key_arn,
            "MESSENGER_OFFLOAD_BUCKET": foundation.offload_bucket_name,
            "AWS_DEFAULT_REGION": Aws.REGION,
        }
        args = ["spark-submit", "--deploy-mode", "cluster",
                "--py-files", self.library.s3_object_url]
        for name, value in env.items():
            args += ["--conf", f"spark.yarn.appMasterEnv.{name}={value}",
                     "--conf", f"spark.executorEnv.{name}={value}"]
        return args

    def _state_machine(
        self, foundation: Foundation, namespace: str, release_label: str,
        instance_type: str, core_instances: int,
    ) -> sfn.StateMachine:
        allowed = ", ".join(sorted(self.jobs))
        unknown = sfn.Fail(self, "UnknownJob", error="UnknownJob",
                           cause=f"input.job must be one of: {allowed}")
        create = tasks.EmrCreateCluster(
            self, "CreateCluster",
            name=sfn.JsonPath.format("messenger-{}", sfn.JsonPath.string_at("$.job")),
            release_label=release_label,
            applications=[tasks.EmrCreateCluster.ApplicationConfigProperty(name="Spark")],
            instances=tasks.EmrCreateCluster.InstancesConfigProperty(
                ec2_subnet_id=self.subnet_id,
                termination_protected=False,
                instance_groups=[
                    tasks.EmrCreateCluster.InstanceGroupConfigProperty(
                        instance_role=tasks.EmrCreateCluster.InstanceRoleType.MASTER,
                        instance_count=1, instance_type=instance_type, name="primary",
                    ),
                    tasks.EmrCreateCluster.InstanceGroupConfigProperty(
                        instance_role=tasks.EmrCreateCluster.InstanceRoleType.CORE,
                        instance_count=core_instances, instance_type=instance_type, name="core",
                    ),
                ],
            ),
            cluster_role=self.job_role,
            service_role=self.service_role,
            auto_scaling_role=self.autoscaling_role,
            log_uri=self.logs_bucket.s3_url_for_object("emr/"),
            visible_to_all_users=True,
            tags={PIPELINE_TAG: self.node.path},
            result_path="$.cluster",
        )
        # The step runs `<spark-submit and settings> <script> <args...>`: a Pass state puts the
        # fixed part in the input (tokens render there), then JSONata appends script and args
        # (JSONPath has no array concatenation).
        submit = sfn.Pass(
            self, "SparkSubmit",
            result=sfn.Result.from_array(self.spark_submit_args(foundation, namespace)),
            result_path="$.submit",
        )
        step_args = (
            "{% $append($append($states.input.submit, [$states.input.script]), "
            "$exists($states.input.args) ? $states.input.args : []) %}"
        )
        add_step = tasks.EmrAddStep.jsonata(
            self, "RunJob",
            cluster_id="{% $states.input.cluster.ClusterId %}",
            name="{% $states.input.job %}",
            jar="command-runner.jar",
            # A list-typed token that renders as the expression string, not a one-item list.
            args=Token.as_list(step_args),
            action_on_failure=tasks.ActionOnFailure.CONTINUE,
            outputs="{% $merge([$states.input, {'step': $states.result}]) %}",
        )
        terminate_after_failure = tasks.EmrTerminateCluster(
            self, "TerminateAfterFailure",
            cluster_id=sfn.JsonPath.string_at("$.cluster.ClusterId"),
            result_path=sfn.JsonPath.DISCARD,
        )
        # Keep the input (the cluster id, to terminate the cluster) and add the error.
        add_step.add_catch(
            terminate_after_failure.next(sfn.Fail(self, "JobFailed", error="JobFailed")),
            outputs="{% $merge([$states.input, {'error': $states.errorOutput}]) %}",
        )
        terminate = tasks.EmrTerminateCluster(
            self, "TerminateCluster",
            cluster_id=sfn.JsonPath.string_at("$.cluster.ClusterId"),
            result_path=sfn.JsonPath.DISCARD,
        )
        choose = sfn.Choice(self, "WhichJob")
        for name, asset in sorted(self.jobs.items()):
            choose.when(
                sfn.Condition.string_equals("$.job", name),
                sfn.Pass(self, f"Script{_camel(name)}",
                         result=sfn.Result.from_string(asset.s3_object_url),
                         result_path="$.script").next(submit),
            )
        choose.otherwise(unknown)
        submit.next(create).next(add_step).next(terminate).next(sfn.Succeed(self, "Done"))

        log_group = logs.LogGroup(
            self, "StateMachineLogs", retention=logs.RetentionDays.THREE_MONTHS,
            removal_policy=RemovalPolicy.DESTROY,
        )
        machine = sfn.StateMachine(
            self, "RunSparkJob",
            definition_body=sfn.DefinitionBody.from_chainable(choose),
            timeout=Duration.hours(12),
            tracing_enabled=True,
            logs=sfn.LogOptions(destination=log_group, level=sfn.LogLevel.ALL,
                                include_execution_data=True),
        )
        clusters = Stack.of(self).format_arn(
            service="elasticmapreduce", resource="cluster", resource_name="*"
        )
        # The CDK tasks may terminate any cluster (createCluster's grant is on "*"): only those
        # this state machine created, tagged at creation, may be terminated.
        machine.add_to_role_policy(iam.PolicyStatement(
            sid="TerminateOnlyOwnClusters", effect=iam.Effect.DENY,
            actions=["elasticmapreduce:TerminateJobFlows"], resources=["*"],
            conditions={"StringNotEquals": {f"aws:ResourceTag/{PIPELINE_TAG}": self.node.path}},
        ))
        policy = machine.role.node.find_child("DefaultPolicy")
        acknowledge_wildcard_resource(
            policy, "*",
            "The cluster does not exist before RunJobFlow (the CDK createCluster task also "
            "tags, describes and terminates it), and X-Ray and the log-delivery APIs of state "
            "machine logging support no resource-level permissions.",
        )
        acknowledge_wildcard_resource(
            policy, clusters,
            "The transient cluster's id exists only at run time; step and terminate calls are "
            "limited to EMR clusters of this account and region.",
        )
        acknowledge_wildcard_resource(
            policy,
            f"arn:{Aws.PARTITION}:iam::{Stack.of(self).account}:role/aws-service-role/"
            "elasticmapreduce.amazonaws.com*/AWSServiceRoleForEMRCleanup*",
            "EmrCreateCluster may create EMR's cleanup service-linked role, whose name suffix "
            "AWS chooses; the grant names that role only.",
        )
        return machine

    def _acknowledge(self) -> None:
        policy = self.job_role.node.find_child("DefaultPolicy")
        acknowledge_wildcard_resource(
            policy, self.code_bucket.arn_for_objects("*"),
            "`messenger emr submit` uploads job code under run-time keys; read-only, this bucket.",
        )
        acknowledge_wildcard_resource(
            policy, self.code_bucket.arn_for_objects(f"{DATA_PREFIX}*"),
            "Spark writes job output under run-time keys; put/delete only under the data/ "
            "prefix of the code bucket.",
        )
        acknowledge_wildcard_resource(
            policy, self.logs_bucket.arn_for_objects("emr/*"),
            "EMR writes its log objects under run-time keys; PutObject on the emr/ prefix only.",
        )
        for role in (self.service_role, self.autoscaling_role):
            acknowledge(
                role, f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/"
                f"{MANAGED_POLICIES[role.node.id]}]",
                "AWS maintains this EMR service policy as EMR's API surface changes; a "
                "hand-written copy would drift. The job role itself is least-privilege.",
            )

    @property
    def job_names(self) -> list[str]:
        return sorted(self.jobs)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.replace("-", "_").split("_"))

