"""`ConsumerService`: one consumer class running on ECS Fargate, scaled on its queue's depth."""

from __future__ import annotations

import re
from collections.abc import Mapping

import jsii
from aws_cdk import (
    Annotations,
    AspectPriority,
    Aspects,
    CfnOutput,
    Duration,
    Fn,
    IAspect,
    RemovalPolicy,
    Stack,
)
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct, IConstruct

from messenger.channel import ChannelSpec, parse_rate
from stacks.channel import Channel
from stacks.consumer_check import check_class_path
from stacks.consumer_image import DEFAULT_ARCHITECTURE, ConsumerImage
from stacks.consumer_scaling import BacklogPerTask, FargateCapacity, Scaling
from stacks.flow_control import (
    CONCURRENCY_CAP_VARIABLE,
    ConcurrencyCaps,
    declares_limits,
    grant_limits_consume,
)
from stacks.foundation import Foundation
from stacks.nag import acknowledge, acknowledge_wildcard_resource
from stacks.topology import Topology

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


class ConsumerClassFacts(Construct):
    """A construct that runs a consumer class from its code (ConsumerService, LambdaConsumer):
    what the synth-time lint reads of that class, and the grants derived from it. Needs
    `image`, `consumer_class`, `requested_processing_timeout` and `requested_idempotent`."""

    image: ConsumerImage
    consumer_class: str
    requested_processing_timeout: Duration | None
    requested_idempotent: bool | None

    @property
    def class_facts(self) -> dict | None:
        """What the consumer class declares (imported at synth from the image's code), or
        {'error': ...}; None for a ready image."""
        if self.image.code_dir is None or not self.image.contains(self.consumer_class):
            return None
        return Topology.of(self).consumer_facts(self.image.code_dir, self.consumer_class)

    @property
    def processing_timeout(self) -> Duration:
        """The requested one, else the class's `processing_timeout`, else 60 s."""
        if self.requested_processing_timeout is not None:
            return self.requested_processing_timeout
        facts = self.class_facts
        if facts and "processing_timeout" in facts:
            return Duration.millis(round(facts["processing_timeout"] * 1000))
        return DEFAULT_PROCESSING_TIMEOUT

    @property
    def idempotent(self) -> bool:
        """The class's `idempotent` (`idempotency_key` implies it); for a ready image, whose class
        synth cannot read, the requested one (default False)."""
        facts = self.class_facts
        if facts and "idempotent" in facts:
            return bool(facts["idempotent"])
        return bool(self.requested_idempotent)

    def grant_from_class(self, foundation: Foundation, role: iam.IRole) -> None:
        """Grant `role` what the class declares it uses: an idempotent class, its records' table.
        Decided at synth (an aspect), when every consumer of the app is known, so the classes of
        one code folder are still imported once, together."""
        Aspects.of(self).add(_ClassGrants(self, foundation, role),
                             priority=AspectPriority.MUTATING)


class ConsumerService(ConsumerClassFacts):
    """A Fargate service running `messenger consume <consumer_class>` on one channel.

    channel: the channel it consumes (grants: consume the queue, forward to the DLQ, the key).
    foundation: the platform key and offload bucket (grants: read offloaded payloads).
    cluster: the ECS cluster (its VPC's public subnets are used unless `subnets` is given).
    image: `ConsumerImage.from_code(folder)` (the service's own code, built for the task's
        architecture from `consumer_image/Dockerfile`) or `ConsumerImage.from_image(...)`.
    consumer_class: 'package.module:Class'; with code, `package` is the folder's name. At synth
        the class is imported from that code alone (as in the image) and must consume this
        channel: same name, ordering, priorities, filter and status tracking.
    namespace: MESSENGER_NAMESPACE of the container.
    processing_timeout: the consumer's per-message processing limit (default: the class's
        `processing_timeout`; given, it must equal it); must not exceed the channel's
        visibility timeout, or SQS redelivers messages still being processed.
    cpu_architecture: 'X86_64' (default) or 'ARM64' (Graviton), of the task and of the image
        built for it (see `stacks.consumer_image` for why X86_64).
    concurrency: MESSENGER_CONCURRENCY, messages processed in parallel per task (default 1).
        `max_tasks × concurrency` caps the channel's handlers running at once; where the
        channel's consumers together may run more than its `max_concurrency`, they take a shared
        lease per job (MESSENGER_CONCURRENCY_CAP, `stacks.flow_control`).
    shutdown_timeout: seconds the consumer gets to finish in-flight work after SIGTERM (30).
    stop_timeout: seconds ECS waits after SIGTERM before SIGKILL; above `shutdown_timeout`,
        at most 120 (default 120).
    cpu / memory_mib: Fargate task size (256 / 512).
    min_tasks / max_tasks: scaling bounds (1 / 10). The template sets no DesiredCount: a
        deploy keeps the count autoscaling reached (a new service starts with one task and
        rises to min_tasks).
    scaling: `BacklogPerTask(...)` (default: target tracking on messages per running task,
        see `stacks.consumer_scaling`) or `StepScaling(...)` (steps on the backlog). While a
        message is processed its task holds ECS scale-in protection
        (`messenger.consume.protection`; the task role may update it).
    capacity: 'on-demand' (default), 'spot', or `FargateCapacity.mix(on_demand_base=...,
        spot_weight=...)`; the cluster needs the Fargate capacity providers (the platform's has).
    environment: extra environment variables (no secrets: they are visible in the task definition).
    Derived from the class, not given: status tracking (the channel's `track_status`, which
    must agree with the class) and idempotency (`idempotent = True` or `idempotency_key`): the
    task role may write status records, or use the idempotency table, only when it does.
    idempotent: deprecated, the class decides; given, it must agree with the class (synth fails
        otherwise). Only for a ready image (`ConsumerImage.from_image`), whose class synth cannot
        read, does it decide (default False: no access to the idempotency table).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        channel: Channel,
        foundation: Foundation,
        cluster: ecs.ICluster,
        image: ConsumerImage | ecs.ContainerImage,
        consumer_class: str,
        namespace: str,
        processing_timeout: Duration | None = None,
        cpu_architecture: str = DEFAULT_ARCHITECTURE,
        concurrency: int = 1,
        shutdown_timeout: Duration = DEFAULT_SHUTDOWN_TIMEOUT,
        stop_timeout: Duration = DEFAULT_STOP_TIMEOUT,
        cpu: int = 256,
        memory_mib: int = 512,
        min_tasks: int = 1,
        max_tasks: int = 10,
        scaling: Scaling | None = None,
        capacity: str | FargateCapacity = "on-demand",
        subnets: ec2.SubnetSelection | None = None,
        environment: Mapping[str, str] | None = None,
        idempotent: bool | None = None,
    ) -> None:
        super().__init__(scope, id)
        check_class_path(f"ConsumerService {id!r}", consumer_class)
        if not isinstance(image, ConsumerImage):
            image = ConsumerImage.from_image(image)
        container_image = image.container_image(cpu_architecture)  # checks the architecture
        if concurrency < 1:
            raise ValueError(f"ConsumerService {id!r}: concurrency must be >= 1, got {concurrency}")
        if not 0 <= min_tasks <= max_tasks:
            raise ValueError(
                f"ConsumerService {id!r}: need 0 <= min_tasks <= max_tasks, got {min_tasks} "
                f"and {max_tasks}"
            )
        scaling = scaling if scaling is not None else BacklogPerTask()
        scaling.validate(min_tasks)
        self.capacity = FargateCapacity.of(capacity)
        self.channel = channel
        self.consumer_class = consumer_class
        self.image = image
        self.requested_processing_timeout = processing_timeout
        self.requested_idempotent = idempotent
        self.shutdown_timeout = shutdown_timeout
        self.stop_timeout = stop_timeout
        topology = Topology.of(self)
        if image.code_dir is not None and image.contains(consumer_class):
            topology.request_consumer(image.code_dir, consumer_class, image.requirements)
        topology.attach(self, ClassValidation(self).validate, _TimeoutValidation(self).validate,
                        _ClusterValidation(cluster, scaling, self.capacity).validate)

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
                cpu_architecture=ecs.CpuArchitecture.of(cpu_architecture),
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
            # At most max_tasks x concurrency handlers run: within the channel's max_concurrency
            # (with the channel's other consumers) no concurrency lease is needed
            CONCURRENCY_CAP_VARIABLE: ConcurrencyCaps.of(self).add(
                channel.spec, max_tasks * concurrency),
            "AWS_REGION": Stack.of(self).region,
            **(environment or {}),
        }
        self.container = self.task_definition.add_container(
            "Consumer",
            image=container_image,
            command=["messenger", "consume", consumer_class],
            environment=self.environment,
            health_check=HEALTH_CHECK,
            stop_timeout=stop_timeout,
            logging=ecs.LogDrivers.aws_logs(stream_prefix="consumer", log_group=self.log_group),
            readonly_root_filesystem=False,
        )
        channel.grant_consume(self.task_definition.task_role)
        self._grant_task_protection(cluster)
        foundation.grant_offload_read(self.task_definition.task_role)
        foundation.grant_workers_write(self.task_definition.task_role)  # `messenger workers`
        foundation.grant_fired_claims(self.task_definition.task_role)  # a retried firing: once
        if any(level.spec.track_status for level in channel.levels):
            foundation.grant_status_write(self.task_definition.task_role)
        if any(level.spec.keep_results for level in channel.levels):
            # its final outcomes, and whatever waits on its jobs advanced (jobs.workflows)
            foundation.grant_workflows(self.task_definition.task_role, results=True)
        self.grant_from_class(foundation, self.task_definition.task_role)
        # Flow control: a channel declaring a limit has its consumers run the limit gate (its
        # run-time limits, rate limiters, lease and reports in the limits table)
        if declares_limits(channel.spec):
            grant_limits_consume(self.task_definition.task_role, channel.spec, foundation.key)

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
            # No DesiredCount: CloudFormation would reset a scaled-out service to it on every
            # update (aws-cdk issue 3919); the scalable target's minimum keeps the floor.
            desired_count=None,
            capacity_provider_strategies=self.capacity.strategies(),
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
        self.scaling_policy = scaling.attach(
            self, self.scaling, queues=channel.queues, cluster_name=cluster.cluster_name,
            service_name=self.service.service_name, concurrency=concurrency,
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

    def _grant_task_protection(self, cluster: ecs.ICluster) -> None:
        """The consumer protects its own task from scale-in while busy
        (`messenger.consume.protection`): one action, on this cluster's tasks only."""
        name = cluster.cluster_name
        producer = Stack.of(cluster)
        if producer.node.path != Stack.of(self).node.path:
            # A named export (one per cluster stack): the reference reads the same at
            # construction and in the template, so the acknowledgement below can name it.
            output_id = re.sub(r"[^A-Za-z0-9]", "", cluster.node.id) + "Name"
            export = f"{producer.stack_name}:{output_id}"
            if producer.node.try_find_child(output_id) is None:
                CfnOutput(producer, output_id, value=name, export_name=export)
            Stack.of(self).add_stack_dependency(producer, "the consumers' cluster name")
            name = Fn.import_value(export)
        tasks = Stack.of(self).format_arn(
            service="ecs", resource="task", resource_name=f"{name}/*"
        )
        role = self.task_definition.task_role
        role.add_to_principal_policy(iam.PolicyStatement(
            actions=["ecs:UpdateTaskProtection"], resources=[tasks],
        ))
        policy = role.node.try_find_child("DefaultPolicy")
        assert policy is not None
        acknowledge_wildcard_resource(
            policy, tasks,
            "A task's id exists only at run time; the grant is ecs:UpdateTaskProtection alone, "
            "on the tasks of this service's cluster (a consumer protects its own task).",
        )

    @property
    def task_role(self) -> iam.IRole:
        return self.task_definition.task_role


class ClassValidation:
    """The consumer class is in the image, importable from its code, and consumes the channel."""

    def __init__(self, service: ConsumerService) -> None:
        self.service = service

    def validate(self) -> list[str]:
        service = self.service
        image, target, spec = service.image, service.consumer_class, service.channel.spec
        if not image.contains(target):
            return [
                f"consumer class {target!r} is not in its image: ConsumerImage.from_code"
                f"({str(image.code_dir)!r}) holds the package {image.package!r} only. Name the "
                f"class '{image.package}.<module>:<Class>', or build the image from the folder "
                f"of package {target.split('.')[0]!r}."
            ]
        facts = service.class_facts
        if facts is None:
            return []
        if "error" in facts:
            return [
                f"consumer class {target!r} cannot be loaded from {image.code_dir} as the image "
                f"would load it: {facts['error']}. Fix the module or class name (the class must "
                f"subclass messenger's Consumer and define handler); a package it needs "
                f"belongs in {image.package}/requirements.txt (then it may be missing where "
                f"`cdk synth` runs)."
            ]
        if "absent" in facts:
            Annotations.of(service).add_warning_v2(
                "messenger:consumer-checked-without-packages",
                f"consumer class {target!r} checked without {', '.join(facts['absent'])} "
                f"(named in {image.package}'s requirements, not installed where cdk synth "
                f"runs): its imports stood in by placeholders, its attributes checked as "
                f"written",
            )
        deployed = {
            "channel": spec.name, "ordered": spec.ordered,
            "priorities": list(spec.priorities), "default_level": spec.default_level,
            "track_status": spec.track_status,
            "filter_policy": spec.message_filter.policy() if spec.message_filter else None,
        }
        errors = [
            f"consumer class {target!r} declares {name}={facts[name]!r} but is deployed for "
            f"channel {spec.name!r} with {name}={value!r}; the consumer would "
            f"{'look for another channel' if name == 'channel' else 'not match its queues'}. "
            f"Make the class attribute and the ChannelSpec agree."
            for name, value in deployed.items()
            if facts.get(name) != value
        ]
        errors.extend(_limit_disagreements(target, spec, facts.get("limits") or {}))
        kind = type(service).__name__
        if service.requested_idempotent is not None:
            if service.requested_idempotent != facts["idempotent"]:
                errors.append(
                    f"{kind} idempotent={service.requested_idempotent} contradicts {target}, "
                    f"which is {'' if facts['idempotent'] else 'not '}idempotent (its "
                    f"`idempotent` and `idempotency_key`); the class decides, and its role gets "
                    f"the idempotency table only when it is: drop the argument."
                )
            else:
                Annotations.of(service).add_warning_v2(
                    "messenger:idempotent-argument-deprecated",
                    f"{kind} idempotent= is derived from {target} now (its `idempotent` and "
                    f"`idempotency_key`): drop the argument",
                )
        requested = service.requested_processing_timeout
        declared = facts["processing_timeout"]
        if requested is not None and requested.to_seconds() != declared:
            errors.append(
                f"{kind} processing_timeout ({requested.to_seconds():g} s) "
                f"differs from "
                f"{target}.processing_timeout ({declared:g} s), which the consumer enforces; "
                f"drop the argument (the class's value is used) or make them equal."
            )
        return errors


def _limit_disagreements(target: str, spec: ChannelSpec,
                         declared: Mapping[str, object]) -> list[str]:
    """A flow-control limit the class declares that its channel's spec does not: the deployed
    queue's declaration holds (docs/flow-control.md), so the class's would silently not."""
    def normal(name: str, value: object) -> float | None:
        """A limit as a number (a rate per second: '600/min' is '10/s')."""
        if value is None:
            return None
        if name == "max_concurrency":
            return float(value)  # type: ignore[arg-type]
        return parse_rate(value, name).per_second

    errors = []
    for name, value in declared.items():
        if value is None:
            continue
        try:
            written = normal(name, value)
        except (TypeError, ValueError) as error:
            errors.append(f"consumer class {target!r}: {error}")
            continue
        deployed = getattr(spec, name)
        if written != normal(name, deployed):
            errors.append(
                f"consumer class {target!r} declares {name}={value!r} but is deployed for "
                f"channel {spec.name!r} with {name}={deployed!r}; the channel's declaration "
                f"(its queue's tag) is the one that holds. Make the class attribute and the "
                f"ChannelSpec agree (or drop the class's).")
    return errors


@jsii.implements(IAspect)
class _ClassGrants:
    """The grants a consumer's class decides (see `ConsumerClassFacts.grant_from_class`)."""

    def __init__(self, consumer: ConsumerClassFacts, foundation: Foundation,
                 role: iam.IRole) -> None:
        self.consumer, self.foundation, self.role = consumer, foundation, role

    def visit(self, node: IConstruct) -> None:
        if node.node.path != self.consumer.node.path:
            return  # the aspect reaches the consumer's children too
        if self.consumer.idempotent:
            self.foundation.grant_idempotency(self.role)


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


class _ClusterValidation:
    """The cluster offers what scaling and capacity need (checked for a cluster built in this
    app; an imported cluster is the caller's to set up)."""

    def __init__(self, cluster: ecs.ICluster, scaling: Scaling, capacity: FargateCapacity) -> None:
        self.cluster, self.scaling, self.capacity = cluster, scaling, capacity

    def validate(self) -> list[str]:
        cluster = self.cluster
        if not isinstance(cluster, ecs.Cluster):
            return []
        errors = []
        stack = Stack.of(cluster)
        if isinstance(self.scaling, BacklogPerTask):
            settings = stack.resolve(cluster.node.default_child.cluster_settings) or []
            if not any(s.get("name") == "containerInsights" and s.get("value") != "disabled"
                       for s in settings):
                errors.append(
                    f"cluster {cluster.node.path} has Container Insights off, and BacklogPerTask "
                    f"scaling divides by its RunningTaskCount (ECS/ContainerInsights): without "
                    f"it the policy has no data and never scales. Create the cluster with "
                    f"container_insights_v2=ecs.ContainerInsights.ENABLED, or use StepScaling()."
                )
        needed = {s.capacity_provider for s in self.capacity.strategies() or []}
        offered = {
            name for child in cluster.node.children
            if isinstance(child, ecs.CfnClusterCapacityProviderAssociations)
            for name in stack.resolve(child.capacity_providers) or []
        }
        if needed - offered:
            errors.append(
                f"cluster {cluster.node.path} does not offer the capacity providers "
                f"{', '.join(sorted(needed - offered))}: create it with "
                f"enable_fargate_capacity_providers=True (the platform's cluster has them)."
            )
        return errors
