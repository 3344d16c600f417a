"""`EmrPipeline`: what EMR needs to run `spark_jobs/`, and a state machine that runs one job.

The state machine runs a job on a transient cluster: check the job name, create the cluster,
add one `spark-submit` step (the job script and the packaged `messenger` library are S3 assets),
terminate the cluster whether the step succeeded or not. Input:
`{"job": "<spark_jobs/ file name without .py>", "args": ["--flag", "value", ...]}`.

A cluster never outlives its job: every task has its own timeout, shorter in sum than the
execution's, and a Catch that leads to terminating the cluster (or, when none was created, to the
failure); EMR throttling is retried; the failure carries its cause. When the execution is stopped
or terminating fails anyway, the cluster ends itself: a failed step terminates it
(ActionOnFailure), and an idle cluster terminates after `idle_timeout` (auto-termination policy).
The driver and executors run Python 3.11 (`messenger.emr_step.EMR_PYTHON`), set in the cluster's
spark-env/spark-defaults and in the step; a bootstrap action makes sure it imports boto3.
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

from messenger.emr_step import EMR_PYTHON, python_confs
from stacks.bundle import REPO_ROOT, library_bundle, spark_job_scripts
from stacks.channel import Channel
from stacks.foundation import Foundation, deliver_access_logs_by_bucket_policy
from stacks.nag import acknowledge, acknowledge_wildcard_resource

#: The run ledger's keys in the dedup table (`messenger.jobs.runs.RUN_LEDGER_PREFIX` + '*').
RUN_LEDGER_KEYS = "run@*"

DEFAULT_RELEASE_LABEL = "emr-7.9.0"
#: The Spark of each release the pipeline is tested against (AWS's release table): the EMR tests
#: run that pyspark (requirements-emr.txt) on Python 3.11.
RELEASE_SPARK = {"emr-7.9.0": "3.5.5"}
#: EMR's managed service policy (v2) only acts on network resources carrying this tag.
EMR_MANAGED_TAG = "for-use-with-amazon-emr-managed-policies"
#: Tag of the clusters the state machine creates (value: the pipeline's construct path); it may
#: terminate no other cluster.
PIPELINE_TAG = "messenger:pipeline"
#: Prefix of the code bucket where jobs may read and write their data.
DATA_PREFIX = "data/"
#: Where `messenger emr submit` uploads code (`messenger.emr_step.CODE_PREFIX`); only uploaded
#: code expires, never the jobs' input and output under `data/`.
CODE_UPLOAD_PREFIX = "emr/"
CODE_EXPIRY = Duration.days(30)
#: What the bootstrap action installs when the step interpreter lacks boto3 (the pin of
#: requirements-emr.txt, where the tests' EMR interpreter gets it).
EMR_BOTO3 = "boto3==1.44.5"
#: Task timeouts. The job's own is a construct parameter; the execution's timeout is their sum
#: plus `EXECUTION_MARGIN`, so a task always times out (and terminates the cluster) first.
CREATE_CLUSTER_TIMEOUT = Duration.hours(1)
TERMINATE_TIMEOUT = Duration.minutes(30)
DEFAULT_JOB_TIMEOUT = Duration.hours(8)
EXECUTION_MARGIN = Duration.minutes(30)
#: Backstop: a cluster with no step running for this long terminates itself.
DEFAULT_IDLE_TIMEOUT = Duration.minutes(30)
#: Errors of EMR's Step Functions integration retried with backoff (throttling surfaces as
#: EMR.AmazonElasticMapReduceException; a bad request fails again and then goes to the Catch).
EMR_RETRY_ERRORS = ["EMR.ThrottlingException", "EMR.AmazonElasticMapReduceException"]
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
    release_label: EMR release (default emr-7.9.0: Spark 3.5.5, Python 3.9 and 3.11).
    instance_type / core_instances: cluster size (m5.xlarge, 2 core nodes).
    job_timeout: the step's limit (default 8 hours); then the cluster is terminated.
    idle_timeout: a cluster without a running step terminates itself after this (default
        30 minutes; 1 minute to 7 days): the backstop when the execution is stopped.
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
        job_timeout: Duration = DEFAULT_JOB_TIMEOUT,
        idle_timeout: Duration = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        super().__init__(scope, id)
        deliver_access_logs_by_bucket_policy(self)
        self.job_timeout, self.idle_timeout = job_timeout, idle_timeout
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
        self.bootstrap = s3_assets.Asset(
            self, "PythonBootstrap", path=str(REPO_ROOT / "stacks" / "emr_python.sh")
        )
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
        # Re-runnable steps (`publish(run_key=)`): dedup claims of the rows, and the run's ledger
        # of finished partitions (items 'run@...' of the same table, `messenger.jobs.runs`:
        # read by each partition, updated by the driver after an attempt).
        foundation.grant_dedup(self.job_role)
        self.job_role.add_to_policy(iam.PolicyStatement(
            actions=["dynamodb:GetItem", "dynamodb:UpdateItem"],
            resources=[foundation.dedup_table.table_arn],
            conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [RUN_LEDGER_KEYS]}},
        ))
        # Verify mode (DescribeKey), and reading/writing the code bucket (SSE-KMS, the CMK).
        foundation.key.grant(
            self.job_role, "kms:DescribeKey", "kms:Decrypt", "kms:GenerateDataKey"
        )
        readable = [self.library.bucket.arn_for_objects(self.library.s3_object_key),
                    self.bootstrap.bucket.arn_for_objects(self.bootstrap.s3_object_key)]
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
        args = ["spark-submit", "--deploy-mode", "cluster", *python_confs(EMR_PYTHON),
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
            configurations=python_configurations(EMR_PYTHON),
            bootstrap_actions=[tasks.EmrCreateCluster.BootstrapActionConfigProperty(
                name="step-python",
                script_bootstrap_action=tasks.EmrCreateCluster.ScriptBootstrapActionConfigProperty(
                    path=self.bootstrap.s3_object_url, args=[EMR_PYTHON, EMR_BOTO3],
                ),
            )],
            # createCluster.sync requires KeepJobFlowAliveWhenNoSteps: the idle policy ends a
            # cluster whose execution was stopped or could not terminate it.
            auto_termination_policy_idle_timeout=self.idle_timeout,
            cluster_role=self.job_role,
            # Immutable here: the task would grant the service role an unconditioned
            # iam:PassRole on the job role (beside our conditioned one, which it voids).
            service_role=self.service_role.without_policy_updates(),
            auto_scaling_role=self.autoscaling_role,
            log_uri=self.logs_bucket.s3_url_for_object("emr/"),
            visible_to_all_users=True,
            tags={PIPELINE_TAG: self.node.path},
            result_path="$.cluster",
            task_timeout=sfn.Timeout.duration(CREATE_CLUSTER_TIMEOUT),
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
            # A failed step ends its cluster even when nothing is left to terminate it.
            action_on_failure=tasks.ActionOnFailure.TERMINATE_CLUSTER,
            outputs="{% $merge([$states.input, {'step': $states.result}]) %}",
            task_timeout=sfn.Timeout.duration(self.job_timeout),
        )
        # Failures carry their cause: `$.error` is the caught {Error, Cause}.
        job_failed = sfn.Fail(
            self, "JobFailed", error_path="$.error.Error", cause_path="$.error.Cause",
        )
        terminate_after_failure = tasks.EmrTerminateCluster(
            self, "TerminateAfterFailure",
            cluster_id=sfn.JsonPath.string_at("$.cluster.ClusterId"),
            result_path=sfn.JsonPath.DISCARD,
            task_timeout=sfn.Timeout.duration(TERMINATE_TIMEOUT),
        )
        terminate_after_failure.next(job_failed)
        # The job's error stays the cause even when terminating fails too (the idle policy
        # still ends the cluster).
        terminate_after_failure.add_catch(job_failed, result_path=sfn.JsonPath.DISCARD)
        # Keep the input (the cluster id, to terminate the cluster) and add the error.
        add_step.add_catch(
            terminate_after_failure,
            outputs="{% $merge([$states.input, {'error': $states.errorOutput}]) %}",
        )
        # No cluster id when creating failed or timed out: a cluster that came up anyway is
        # ended by its idle policy.
        create.add_catch(
            sfn.Fail(self, "ClusterFailed", error_path="$.error.Error",
                     cause_path="$.error.Cause"),
            result_path="$.error",
        )
        terminate = tasks.EmrTerminateCluster(
            self, "TerminateCluster",
            cluster_id=sfn.JsonPath.string_at("$.cluster.ClusterId"),
            result_path=sfn.JsonPath.DISCARD,
            task_timeout=sfn.Timeout.duration(TERMINATE_TIMEOUT),
        )
        terminate.add_catch(
            sfn.Fail(self, "TerminateFailed", error_path="$.error.Error",
                     cause_path="$.error.Cause"),
            result_path="$.error",
        )
        for task in (create, add_step, terminate_after_failure, terminate):
            task.add_retry(errors=EMR_RETRY_ERRORS, interval=Duration.seconds(5),
                           backoff_rate=2, max_attempts=5, jitter_strategy=sfn.JitterType.FULL)
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
            timeout=self.execution_timeout,
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
        # The CDK task lets the state machine pass the three EMR roles to anything: each may go
        # only where AWS's AmazonEMRFullAccessPolicy_v2 passes its kind of role.
        for role, service in self._passed_to.items():
            machine.add_to_role_policy(iam.PolicyStatement(
                sid=f"Pass{role.node.id}OnlyTo{service.split('.')[0].title().replace('-', '')}",
                effect=iam.Effect.DENY, actions=["iam:PassRole"], resources=[role.role_arn],
                conditions={"StringNotLike": {"iam:PassedToService": f"{service}*"}},
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
    def _passed_to(self) -> dict[iam.Role, str]:
        """The service each EMR role is passed to (AWS's EMR full-access policy)."""
        return {
            self.service_role: "elasticmapreduce.amazonaws.com",
            self.job_role: "ec2.amazonaws.com",
            self.autoscaling_role: "application-autoscaling.amazonaws.com",
        }

    @property
    def execution_timeout(self) -> Duration:
        """Longer than the longest path of task timeouts, so that a task times out first."""
        seconds = sum(d.to_seconds() for d in (
            CREATE_CLUSTER_TIMEOUT, self.job_timeout, TERMINATE_TIMEOUT, EXECUTION_MARGIN
        ))
        return Duration.seconds(seconds)

    @property
    def job_names(self) -> list[str]:
        return sorted(self.jobs)


def python_configurations(python: str) -> list[tasks.EmrCreateCluster.ConfigurationProperty]:
    """Cluster configuration choosing `python` for PySpark (spark-env and spark-defaults), so
    that steps added by hand or by `messenger emr submit` use it too."""
    config = tasks.EmrCreateCluster.ConfigurationProperty
    return [
        config(classification="spark-env", configurations=[config(
            classification="export",
            properties={"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python},
        )]),
        config(classification="spark-defaults", properties={
            "spark.pyspark.python": python, "spark.pyspark.driver.python": python,
        }),
    ]


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.replace("-", "_").split("_"))

