"""A small model of the backlog-per-task policy's decisions, fed from the synthesized template.

What it models, minute by minute (SQS and Container Insights publish once a minute):
- the metric exactly as the template computes it: (visible + in flight) / running tasks;
- scale-out as Application Auto Scaling documents target tracking: once the metric has been
  above the target for 3 one-minute datapoints (the alarm AWS creates), capacity becomes
  ceil(current x metric / target), within min/max, and not again before the scale-out cooldown;
- scale-in as the template's step policy and alarm say: the metric below the alarm threshold
  for its evaluation periods, then the step's percentage of the tasks (App Auto Scaling rounds a
  fraction down, to at least MinAdjustmentMagnitude), not again before the cooldown.
What it does not model: metric delays beyond the one-minute period, AWS's undisclosed
refinements of target tracking, task start-up variance (every task runs 2 minutes after it is
asked for), ECS task protection (a protected task would stop later, never sooner) and Spot
interruptions. Its workers take messages at a fixed rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from examples.cdk import EXAMPLE_CONSUMERS
from tests.infra.conftest import CloudAssembly, consumer_services, scaling_policies

#: Minutes a task takes from being asked for to taking messages (pull, start, health).
TASK_START_MINUTES = 2
#: Datapoints of the high alarm target tracking creates (AWS: 3 of 3, one minute each).
SCALE_OUT_DATAPOINTS = 3


@dataclass(frozen=True)
class Policy:
    """The scaling settings of one consumer service, read from its template."""

    min_tasks: int
    max_tasks: int
    target: float
    scale_out_cooldown_minutes: float
    scale_in_below: float
    scale_in_minutes: int
    scale_in_percent: int
    scale_in_min_tasks: int
    scale_in_cooldown_minutes: float

    @classmethod
    def of(cls, assembly: CloudAssembly, consumer: str) -> Policy:
        service_id, _ = consumer_services(assembly)[consumer]
        resources = assembly.template("examples")["Resources"]
        (target,) = [r["Properties"] for r in resources.values()
                     if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"
                     and service_id in str(r["Properties"]["ResourceId"])]
        policies = scaling_policies(assembly, service_id)
        (tracking,) = [p["TargetTrackingScalingPolicyConfiguration"] for p in policies
                       if p["PolicyType"] == "TargetTrackingScaling"]
        (step_id,) = [k for k, r in resources.items() if r["Properties"] in policies
                      and r["Properties"]["PolicyType"] == "StepScaling"]
        step = resources[step_id]["Properties"]["StepScalingPolicyConfiguration"]
        (alarm,) = [r["Properties"] for r in resources.values()
                    if r["Type"] == "AWS::CloudWatch::Alarm"
                    and {"Ref": step_id} in r["Properties"].get("AlarmActions", [])]
        assert alarm["ComparisonOperator"] == "LessThanThreshold"
        assert step["AdjustmentType"] == "PercentChangeInCapacity"
        (adjustment,) = step["StepAdjustments"]
        assert tracking["DisableScaleIn"] is True
        return cls(
            min_tasks=target["MinCapacity"], max_tasks=target["MaxCapacity"],
            target=tracking["TargetValue"],
            scale_out_cooldown_minutes=tracking["ScaleOutCooldown"] / 60,
            scale_in_below=alarm["Threshold"], scale_in_minutes=alarm["DatapointsToAlarm"],
            scale_in_percent=-adjustment["ScalingAdjustment"],
            scale_in_min_tasks=step["MinAdjustmentMagnitude"],
            scale_in_cooldown_minutes=step["Cooldown"] / 60,
        )


@dataclass
class Fleet:
    """Queue and tasks of one service; `history` holds (minute, desired, metric, backlog)."""

    policy: Policy
    messages_per_task_minute: float
    desired: int = 0
    starting: list[tuple[int, int]] = field(default_factory=list)  # (ready at, tasks)
    running: int = 0
    backlog: float = 0.0
    metrics: list[float] = field(default_factory=list)
    last_out: float = -math.inf
    last_in: float = -math.inf
    history: list[tuple[int, int, float, float]] = field(default_factory=list)
    scale_ins: list[tuple[int, int, int]] = field(default_factory=list)  # (minute, from, to)

    def __post_init__(self) -> None:
        self.desired = self.running = self.policy.min_tasks

    def minute(self, now: int, arrivals: float) -> None:
        policy = self.policy
        self.running += sum(n for ready, n in self.starting if ready <= now)
        self.starting = [(ready, n) for ready, n in self.starting if ready > now]
        self.backlog += arrivals
        self.backlog -= min(self.backlog, self.running * self.messages_per_task_minute)
        # The template's expression: IF(tasks > 0, backlog / tasks, backlog)
        metric = self.backlog / self.running if self.running else self.backlog
        self.metrics.append(metric)
        recent = self.metrics[-SCALE_OUT_DATAPOINTS:]
        if len(recent) == SCALE_OUT_DATAPOINTS and all(m > policy.target for m in recent) \
                and now - self.last_out >= policy.scale_out_cooldown_minutes:
            wanted = min(policy.max_tasks, math.ceil(self.desired * metric / policy.target))
            if wanted > self.desired:
                self.starting.append((now + TASK_START_MINUTES, wanted - self.desired))
                self.desired, self.last_out = wanted, now
        quiet = self.metrics[-policy.scale_in_minutes:]
        if len(quiet) == policy.scale_in_minutes \
                and all(m < policy.scale_in_below for m in quiet) \
                and now - self.last_in >= policy.scale_in_cooldown_minutes \
                and self.desired > policy.min_tasks:
            remove = max(policy.scale_in_min_tasks,
                         math.floor(self.desired * policy.scale_in_percent / 100))
            wanted = max(policy.min_tasks, self.desired - remove)
            self.scale_ins.append((now, self.desired, wanted))
            # Tasks still starting are cancelled first, then running ones stop.
            cancel = self.desired - wanted
            while cancel and self.starting:
                ready, n = self.starting.pop()
                if n > cancel:
                    self.starting.append((ready, n - cancel))
                cancel -= min(n, cancel)
            self.running -= cancel
            self.desired, self.last_in = wanted, now
        self.history.append((now, self.desired, metric, self.backlog))


def simulate(policy: Policy, arrivals: Callable[[int], float], minutes: int,
             seconds_per_message: float) -> Fleet:
    fleet = Fleet(policy, messages_per_task_minute=60 / seconds_per_message)
    for now in range(minutes):
        fleet.minute(now, arrivals(now))
    return fleet


@pytest.fixture(scope="module")
def orders_policy(assembly: CloudAssembly) -> Policy:
    # The orders consumer: 2 s per message, 5 minutes acceptable -> 150 messages per task
    return Policy.of(assembly, EXAMPLE_CONSUMERS["orders"])


def test_the_model_reads_the_orders_policy(orders_policy: Policy) -> None:
    assert orders_policy == Policy(
        min_tasks=1, max_tasks=10, target=150, scale_out_cooldown_minutes=1,
        scale_in_below=75, scale_in_minutes=15, scale_in_percent=20, scale_in_min_tasks=1,
        scale_in_cooldown_minutes=5,
    )


def test_a_backlog_scales_out_at_once_and_drains(orders_policy: Policy) -> None:
    # Given one task and a burst of 6,000 orders, then none
    fleet = simulate(orders_policy, lambda minute: 6000 if minute == 0 else 0, 180,
                     seconds_per_message=2)
    desired = [d for _, d, _, _ in fleet.history]
    # Then after three minutes above the target it asks for all ten tasks in one step
    first_out = next(minute for minute, d, _, _ in fleet.history if d > 1)
    assert first_out == SCALE_OUT_DATAPOINTS - 1
    assert desired[first_out] == orders_policy.max_tasks
    assert max(desired) == orders_policy.max_tasks  # never above max
    # And the backlog drains about ten times faster than one task would (6,000 / 30 a minute
    # for one task: 200 minutes)
    drained = next(minute for minute, _, _, backlog in fleet.history if backlog == 0)
    assert drained < 30


def test_scale_in_is_gradual_and_waits_for_a_quiet_queue(orders_policy: Policy) -> None:
    fleet = simulate(orders_policy, lambda minute: 6000 if minute == 0 else 0, 240,
                     seconds_per_message=2)
    drained = next(minute for minute, _, _, backlog in fleet.history if backlog == 0)
    assert fleet.scale_ins, "the fleet goes back to its minimum"
    first, start, _ = fleet.scale_ins[0]
    # No task goes before the backlog per task has been under half the target for 15 minutes
    quiet_since = next(minute for minute, _, metric, _ in fleet.history
                       if minute > 3 and metric < orders_policy.scale_in_below)
    assert first >= quiet_since + orders_policy.scale_in_minutes - 1
    assert first > drained
    # Each scale-in removes at most a fifth of the fleet (at least one task), five minutes apart
    minutes = [minute for minute, _, _ in fleet.scale_ins]
    assert all(later - earlier >= 5 for earlier, later in zip(minutes, minutes[1:], strict=False))
    for _, before, after in fleet.scale_ins:
        assert 1 <= before - after <= max(1, before // 5)
    # So ten tasks come down to one over half an hour or more, never in one step
    assert start == orders_policy.max_tasks
    assert fleet.history[-1][1] == orders_policy.min_tasks
    assert fleet.scale_ins[-1][0] - first >= 30


def test_a_steady_stream_gets_about_the_tasks_it_needs(orders_policy: Policy) -> None:
    # Given 100 orders a minute (one task takes 30 a minute: 3.3 tasks needed)
    fleet = simulate(orders_policy, lambda minute: 100, 360, seconds_per_message=2)
    settled = fleet.history[60:]
    desired = [d for _, d, _, _ in settled]
    # Then the fleet runs between what the load needs and twice that on average, never at
    # the maximum. (It is a sawtooth: with more tasks than needed the queue empties, the
    # metric reads 0 and the fleet steps down until a backlog builds again.)
    assert 100 / 30 <= sum(desired) / len(desired) <= 2 * 100 / 30
    assert max(desired) < orders_policy.max_tasks
    # And the backlog per task stays under twice the target: a message waits at most about
    # twice the accepted latency
    assert max(metric for _, _, metric, _ in settled) <= 2 * orders_policy.target
