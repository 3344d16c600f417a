"""How a `ConsumerService` scales, and on what capacity its tasks run.

- `BacklogPerTask` (the default): messages per running task, AWS's recommended metric for queue
  workers; target tracking scales out, a gentle step policy scales in. The acceptable backlog
  per task is derived from the consumer's average processing time and the latency the team
  accepts.
- `StepScaling`: step scaling on the backlog itself (the policy before target tracking).
- `FargateCapacity`: on-demand Fargate, Fargate Spot, or a weighted mix with an on-demand base.

Both policies count a message being processed as backlog (visible plus in flight, summed over
the channel's priority levels): a task working on one is busy, so the policy never scales in
below the tasks still working, and ECS task protection only has to cover the race. See
docs/fargate-scaling.md for the formula with a worked example.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from aws_cdk import Duration, Names
from aws_cdk import aws_applicationautoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

#: Every metric the policies read: SQS publishes its queue metrics once a minute.
METRIC_PERIOD = Duration.minutes(1)
#: Like `QueueProcessingFargateService`: one task fewer when nothing is waiting or in flight,
#: one more from 100 messages, five more from 500.
DEFAULT_SCALING_STEPS = (
    autoscaling.ScalingInterval(upper=0, change=-1),
    autoscaling.ScalingInterval(lower=100, change=+1),
    autoscaling.ScalingInterval(lower=500, change=+5),
)
#: Where ECS Container Insights publishes a service's running tasks (the cluster must have
#: Container Insights on; the platform's cluster has).
RUNNING_TASKS_NAMESPACE = "ECS/ContainerInsights"
RUNNING_TASKS_METRIC = "RunningTaskCount"
#: Scale in only below this share of the target: removing up to half the tasks then leaves the
#: backlog per task below the target (no flapping with scale-out).
SCALE_IN_BELOW = 0.5
MAX_SCALE_IN_PERCENT = 50
#: CloudWatch evaluates at most 24 hours of datapoints; an hour is a long enough wait here.
MAX_SCALE_IN_MINUTES = 60
#: ECS limits of a capacity provider strategy item.
MAX_CAPACITY_WEIGHT = 1000
MAX_CAPACITY_BASE = 100_000


class ScalingError(ValueError):
    """A scaling or capacity setting is out of range (names the field and the allowed values)."""


def _seconds(value: Duration) -> float:
    return float(value.to_seconds())


@dataclass(frozen=True)
class BacklogPerTask:
    """Scaling on backlog per task: (visible + in-flight messages) ÷ running tasks.

    Out: target tracking, AWS's recommended policy for queue workers: when backlog per task is
    above the target, Application Auto Scaling adds tasks in proportion (current tasks ×
    metric ÷ target). In: gently, by a step policy on the same metric, since target tracking
    may drop a whole fleet in one step: when backlog per task stays below half the target for
    `scale_in_after`, remove `scale_in_percent` % of the tasks (at least one), then wait
    `scale_in_cooldown`. Removing a fifth of the tasks raises the metric by a quarter at most,
    so it stays below the target and scale-in never flaps with scale-out.

    The target (the acceptable backlog per task) is
        acceptable_latency ÷ average_processing_time × concurrency
    e.g. 5 minutes ÷ 2 s × 1 = 150 messages per task: a message arriving behind 150 others per
    task waits about 5 minutes. `target` sets it directly instead.

    average_processing_time: the consumer's mean time per message (default 1 s; measure it).
    acceptable_latency: how long a message may wait in the queue at steady load (default 5 min).
    target: messages per task (> 0); overrides the formula.
    scale_out_cooldown: after adding tasks, before adding more (default 60 s: SQS metrics come
        once a minute, and each scale-out is already proportional to the backlog).
    scale_in_after: how long backlog per task stays below half the target before a scale-in
        (default 15 min, whole minutes, 1 to 60).
    scale_in_percent: share of the tasks one scale-in removes (default 20, 1 to 50; at least
        one task).
    scale_in_cooldown: between scale-ins (default 5 min).
    Needs min_tasks >= 1 (the metric divides by running tasks; target tracking cannot scale a
    service out of zero in proportion) and a cluster with Container Insights (RunningTaskCount).
    """

    average_processing_time: Duration = field(default_factory=lambda: Duration.seconds(1))
    acceptable_latency: Duration = field(default_factory=lambda: Duration.minutes(5))
    target: float | None = None
    scale_out_cooldown: Duration = field(default_factory=lambda: Duration.seconds(60))
    scale_in_after: Duration = field(default_factory=lambda: Duration.minutes(15))
    scale_in_percent: int = 20
    scale_in_cooldown: Duration = field(default_factory=lambda: Duration.minutes(5))

    def target_value(self, concurrency: int) -> float:
        """Messages per task the policy holds the backlog at."""
        if self.target is not None:
            if isinstance(self.target, bool) or not self.target > 0:
                raise ScalingError(f"BacklogPerTask target must be > 0, got {self.target!r}")
            return float(self.target)
        processing = _seconds(self.average_processing_time)
        latency = _seconds(self.acceptable_latency)
        if processing <= 0 or latency <= 0:
            raise ScalingError(
                f"BacklogPerTask average_processing_time and acceptable_latency must be > 0 s, "
                f"got {processing:g} s and {latency:g} s"
            )
        return latency / processing * concurrency

    @property
    def scale_in_minutes(self) -> int:
        return round(_seconds(self.scale_in_after) / 60)

    def validate(self, min_tasks: int) -> None:
        if min_tasks < 1:
            raise ScalingError(
                f"min_tasks must be >= 1 with BacklogPerTask scaling, got {min_tasks}: the "
                f"policy divides the backlog by running tasks. Use StepScaling() to scale to 0."
            )
        if not 1 <= self.scale_in_percent <= MAX_SCALE_IN_PERCENT:
            raise ScalingError(
                f"BacklogPerTask scale_in_percent must be from 1 to {MAX_SCALE_IN_PERCENT}, "
                f"got {self.scale_in_percent!r}"
            )
        after = _seconds(self.scale_in_after)
        if after % 60 or not 1 <= after / 60 <= MAX_SCALE_IN_MINUTES:
            raise ScalingError(
                f"BacklogPerTask scale_in_after must be whole minutes from 1 to "
                f"{MAX_SCALE_IN_MINUTES}, got {after:g} s"
            )
        for name in ("scale_out_cooldown", "scale_in_cooldown"):
            if _seconds(getattr(self, name)) < 0:
                raise ScalingError(f"BacklogPerTask {name} must be >= 0 s")

    def attach(
        self, scope: Construct, scalable: ecs.ScalableTaskCount, *, queues: Sequence[sqs.IQueue],
        cluster_name: str, service_name: str, concurrency: int,
    ) -> autoscaling.CfnScalingPolicy:
        """The target-tracking policy (L1: the L2 takes a single metric, not metric math) that
        scales out, and the step policy with its alarm that scales in."""
        target = scalable.node.find_child("Target")
        assert isinstance(target, autoscaling.ScalableTarget)
        value = self.target_value(concurrency)
        policy = autoscaling.CfnScalingPolicy(
            scope, "BacklogPerTask",
            policy_name=Names.unique_id(scope) + "BacklogPerTask",
            policy_type="TargetTrackingScaling",
            scaling_target_id=target.scalable_target_id,
            target_tracking_scaling_policy_configuration=(
                autoscaling.CfnScalingPolicy.TargetTrackingScalingPolicyConfigurationProperty(
                    target_value=value,
                    disable_scale_in=True,  # the step policy below scales in, gently
                    scale_out_cooldown=round(_seconds(self.scale_out_cooldown)),
                    customized_metric_specification=(
                        autoscaling.CfnScalingPolicy.CustomizedMetricSpecificationProperty(
                            metrics=backlog_per_task_queries(queues, cluster_name, service_name)
                        )
                    ),
                )
            ),
        )
        scale_in = autoscaling.StepScalingAction(
            scope, "ScaleIn", scaling_target=target,
            adjustment_type=autoscaling.AdjustmentType.PERCENT_CHANGE_IN_CAPACITY,
            min_adjustment_magnitude=1,
            cooldown=self.scale_in_cooldown,
            metric_aggregation_type=autoscaling.MetricAggregationType.MAXIMUM,
        )
        scale_in.add_adjustment(adjustment=-self.scale_in_percent, upper_bound=0)
        alarm = cloudwatch.Alarm(
            scope, "ScaleInAlarm",
            alarm_description=(
                f"backlog per task below {value * SCALE_IN_BELOW:g} (half the target) for "
                f"{self.scale_in_minutes} minutes: remove {self.scale_in_percent} % of the tasks"
            ),
            metric=backlog_per_task(queues, cluster_name, service_name),
            threshold=value * SCALE_IN_BELOW,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=self.scale_in_minutes,
            datapoints_to_alarm=self.scale_in_minutes,
            # No data (a metric gap) is no reason to remove tasks.
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(cloudwatch_actions.ApplicationScalingAction(scale_in))
        return policy


@dataclass(frozen=True)
class StepScaling:
    """Step scaling on the backlog, visible plus in-flight messages (default: -1 at 0, +1 from
    100, +5 from 500), `cooldown` between adjustments (2 min). Allows min_tasks = 0."""

    steps: Sequence[autoscaling.ScalingInterval] = DEFAULT_SCALING_STEPS
    cooldown: Duration = field(default_factory=lambda: Duration.minutes(2))

    def validate(self, min_tasks: int) -> None:
        if not self.steps:
            raise ScalingError("StepScaling steps must not be empty")

    def attach(
        self, scope: Construct, scalable: ecs.ScalableTaskCount, *, queues: Sequence[sqs.IQueue],
        cluster_name: str, service_name: str, concurrency: int,
    ) -> autoscaling.StepScalingPolicy:
        return scalable.scale_on_metric(
            "QueueDepth",
            metric=backlog(queues),
            scaling_steps=list(self.steps),
            adjustment_type=autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            cooldown=self.cooldown,
        )


#: What `ConsumerService(scaling=...)` takes.
Scaling = BacklogPerTask | StepScaling


def _queue_metrics(queues: Sequence[sqs.IQueue]) -> dict[str, cloudwatch.Metric]:
    """visible<i> and inflight<i> of each level's queue, per minute, maximum."""
    metrics = {}
    for index, queue in enumerate(queues):
        metrics[f"visible{index}"] = queue.metric_approximate_number_of_messages_visible(
            period=METRIC_PERIOD, statistic="Maximum"
        )
        metrics[f"inflight{index}"] = queue.metric_approximate_number_of_messages_not_visible(
            period=METRIC_PERIOD, statistic="Maximum"
        )
    return metrics


def backlog(queues: Sequence[sqs.IQueue]) -> cloudwatch.IMetric:
    """Messages waiting or being processed: visible plus in flight (not visible), summed over
    the channel's priority levels. In-flight messages count: a task working on one is busy, so
    the service scales in only when every message is done, never under a working task."""
    metrics = _queue_metrics(queues)
    return cloudwatch.MathExpression(
        expression=" + ".join(metrics), using_metrics=metrics,
        label="backlog: visible + in flight (all levels)", period=METRIC_PERIOD,
    )


def _running_tasks(cluster_name: str, service_name: str) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace=RUNNING_TASKS_NAMESPACE, metric_name=RUNNING_TASKS_METRIC,
        dimensions_map={"ClusterName": cluster_name, "ServiceName": service_name},
        period=METRIC_PERIOD, statistic="Average",
    )


def backlog_per_task(
    queues: Sequence[sqs.IQueue], cluster_name: str, service_name: str
) -> cloudwatch.MathExpression:
    """Backlog per task as a CloudWatch metric-math expression (for alarms and dashboards)."""
    metrics: dict[str, cloudwatch.IMetric] = dict(_queue_metrics(queues))
    expression = backlog_per_task_expression(list(metrics))
    metrics["tasks"] = _running_tasks(cluster_name, service_name)
    return cloudwatch.MathExpression(
        expression=expression, using_metrics=metrics, period=METRIC_PERIOD,
        label="messages (visible + in flight) per running task",
    )


def backlog_per_task_expression(metric_ids: Sequence[str]) -> str:
    """backlog ÷ running tasks; while no task runs (a deploy, a crash loop), the backlog
    itself, so the value stays defined and high."""
    total = " + ".join(metric_ids)
    return f"IF(tasks > 0, ({total}) / tasks, {total})"


def backlog_per_task_queries(
    queues: Sequence[sqs.IQueue], cluster_name: str, service_name: str
) -> list[autoscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty]:
    """The metric-math queries of the policy: each queue metric, the running tasks, and one
    expression returning backlog per task (the only one with ReturnData)."""
    query = autoscaling.CfnScalingPolicy.TargetTrackingMetricDataQueryProperty
    stat = autoscaling.CfnScalingPolicy.TargetTrackingMetricStatProperty
    metric = autoscaling.CfnScalingPolicy.TargetTrackingMetricProperty
    dimension = autoscaling.CfnScalingPolicy.TargetTrackingMetricDimensionProperty
    queries = []
    for metric_id, queue_metric in _queue_metrics(queues).items():
        queue_name = queue_metric.dimensions["QueueName"]
        queries.append(query(
            id=metric_id, return_data=False,
            metric_stat=stat(stat="Maximum", metric=metric(
                namespace=queue_metric.namespace, metric_name=queue_metric.metric_name,
                dimensions=[dimension(name="QueueName", value=queue_name)],
            )),
        ))
    tasks = _running_tasks(cluster_name, service_name)
    queries.append(query(
        id="tasks", return_data=False,
        metric_stat=stat(stat="Average", metric=metric(
            namespace=tasks.namespace, metric_name=tasks.metric_name,
            dimensions=[dimension(name=name, value=value)
                        for name, value in tasks.dimensions.items()],
        )),
    ))
    queries.append(query(
        id="backlog_per_task", return_data=True,
        label="messages (visible + in flight) per running task",
        expression=backlog_per_task_expression([q.id for q in queries[:-1]]),
    ))
    return queries


@dataclass(frozen=True)
class FargateCapacity:
    """Where the tasks run: on-demand Fargate, Fargate Spot, or a weighted mix.

    on_demand_base: tasks always on on-demand Fargate before the weights apply (default 0).
    on_demand_weight / spot_weight: how further tasks split (0 to 1000 each, not both 0).
    `FargateCapacity.of("on-demand")` (the default: launch type FARGATE, no strategy),
    `FargateCapacity.of("spot")`, `FargateCapacity.mix(on_demand_base=1, spot_weight=3)`.
    Spot tasks may be stopped with a two-minute warning (SIGTERM, then SIGKILL after the stop
    timeout, at most 120 s): the consumer stops receiving, finishes or releases in-flight
    messages, and an unfinished message becomes visible again for another task.
    """

    on_demand_base: int = 0
    on_demand_weight: int = 1
    spot_weight: int = 0

    CHOICES = ("on-demand", "spot")

    @classmethod
    def of(cls, value: str | FargateCapacity) -> FargateCapacity:
        if isinstance(value, FargateCapacity):
            capacity = value
        elif value == "on-demand":
            capacity = cls()
        elif value == "spot":
            capacity = cls(on_demand_weight=0, spot_weight=1)
        else:
            raise ScalingError(
                f"capacity must be one of {', '.join(cls.CHOICES)} or a FargateCapacity, "
                f"got {value!r}"
            )
        capacity.validate()
        return capacity

    @classmethod
    def mix(
        cls, *, on_demand_base: int = 1, on_demand_weight: int = 1, spot_weight: int = 1
    ) -> FargateCapacity:
        return cls.of(cls(on_demand_base, on_demand_weight, spot_weight))

    def validate(self) -> None:
        for name in ("on_demand_weight", "spot_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not 0 <= value <= MAX_CAPACITY_WEIGHT:
                raise ScalingError(
                    f"FargateCapacity {name} must be a whole number from 0 to "
                    f"{MAX_CAPACITY_WEIGHT}, got {value!r}"
                )
        if self.on_demand_weight == self.spot_weight == 0:
            raise ScalingError("FargateCapacity on_demand_weight and spot_weight are both 0")
        base = self.on_demand_base
        if isinstance(base, bool) or not isinstance(base, int) or \
                not 0 <= base <= MAX_CAPACITY_BASE:
            raise ScalingError(
                f"FargateCapacity on_demand_base must be a whole number from 0 to "
                f"{MAX_CAPACITY_BASE}, got {base!r}"
            )

    @property
    def uses_spot(self) -> bool:
        return self.spot_weight > 0

    def strategies(self) -> list[ecs.CapacityProviderStrategy] | None:
        """The service's capacity provider strategy; None for plain on-demand, which keeps the
        launch type (a deployed service is not moved to a strategy it does not need)."""
        if not self.uses_spot and self.on_demand_base == 0:
            return None
        found = []
        if self.on_demand_weight or self.on_demand_base:
            found.append(ecs.CapacityProviderStrategy(
                capacity_provider="FARGATE", base=self.on_demand_base or None,
                weight=self.on_demand_weight,
            ))
        if self.spot_weight:
            found.append(ecs.CapacityProviderStrategy(
                capacity_provider="FARGATE_SPOT", weight=self.spot_weight,
            ))
        return found
