"""`LambdaConsumer`: one consumer class run by AWS Lambda on its channel's queue(s).

The function is the platform's (`lambdas/consumer/handler.py`, `messenger.consume.lambda_runtime`)
with the team's code folder beside it; MESSENGER_CONSUMER names the class, as the Fargate
image's command does. Lambda's SQS event source polls each queue of the channel (every priority
level's) and reports batch item failures, so only the messages that failed return.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Duration, Names, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

from messenger.channel import lambda_consumer_prefix
from stacks.bundle import consumer_lambda_bundle
from stacks.channel import Channel
from stacks.consumer_check import check_class_path
from stacks.consumer_image import ConsumerImage
from stacks.consumer_service import ClassValidation, ConsumerClassFacts
from stacks.flow_control import (
    CONCURRENCY_CAP_VARIABLE,
    ConcurrencyCaps,
    declares_limits,
    grant_limits_consume,
)
from stacks.foundation import Foundation
from stacks.nag import acknowledge
from stacks.topology import Topology

RUNTIME = lambda_.Runtime.PYTHON_3_11
#: A function's name has at most 64 characters.
LAMBDA_MAX_NAME_LENGTH = 64
#: Lambda runs a function for at most 15 minutes.
LAMBDA_MAX_TIMEOUT_SECONDS = 900
#: AWS's guidance for an SQS event source: the queue's visibility timeout is at least six times
#: the function's timeout (Lambda may retry a throttled batch while its messages stay leased).
VISIBILITY_PER_FUNCTION_TIMEOUT = 6
#: `messenger.consume.lambda_runtime.FINISH_SECONDS`: the end of an invocation kept for
#: dead-letter forwards, releases and the response (stacks import no runtime code).
FINISH_SECONDS = 3
#: SQS event source batch sizes: FIFO queues take at most 10 per batch; standard queues up to
#: 10,000, above 10 only with a batching window.
MAX_FIFO_BATCH = 10
MAX_STANDARD_BATCH = 10_000
#: An event source's maximum concurrency: 2 to 1,000 concurrent invocations.
MIN_MAX_CONCURRENCY, MAX_MAX_CONCURRENCY = 2, 1000
#: Provisioned mode of an SQS event source (ProvisionedPollerConfig): minimum pollers 2-200,
#: maximum pollers 2-2,000 (AWS's defaults when one is left out: 2 and 200). Exclusive with
#: MaximumConcurrency.
MIN_POLLERS_RANGE, MAX_POLLERS_RANGE = (2, 200), (2, 2000)
DEFAULT_MIN_POLLERS, DEFAULT_MAX_POLLERS = 2, 200
DEFAULT_MAX_MESSAGE_AGE = Duration.minutes(15)


@dataclass(frozen=True)
class EventSourceScaling:
    """How each of a Lambda consumer's event sources scales: MaximumConcurrency, or
    provisioned mode's pollers, or neither; `cap`: the most handlers all of them run at once
    (None: no bound the consumer can count on)."""

    max_concurrency: int | None = None
    pollers: lambda_.ProvisionedPollerConfig | None = None
    cap: int | None = None

    @classmethod
    def of(cls, who: str, channel: Channel, max_concurrency: int | None,
           min_pollers: int | None, max_pollers: int | None) -> EventSourceScaling:
        """Checked against AWS's ranges (ValueError naming the field); the default maximum
        concurrency derived from the channel's `max_concurrency`."""
        provisioned = min_pollers is not None or max_pollers is not None
        if provisioned and max_concurrency is not None:
            raise ValueError(
                f"{who}: max_concurrency and provisioned mode (min_pollers, max_pollers) cannot "
                f"be set at once: AWS takes either ScalingConfig.MaximumConcurrency or "
                f"ProvisionedPollerConfig on an event source mapping; leave one out"
            )
        if provisioned:
            low = DEFAULT_MIN_POLLERS if min_pollers is None else min_pollers
            high = DEFAULT_MAX_POLLERS if max_pollers is None else max_pollers
            for field, value, (least, most) in (("min_pollers", min_pollers, MIN_POLLERS_RANGE),
                                                 ("max_pollers", max_pollers, MAX_POLLERS_RANGE)):
                if value is not None and not least <= value <= most:
                    raise ValueError(
                        f"{who}: {field} must be from {least} to {most}, got {value}")
            if low > high:
                raise ValueError(
                    f"{who}: min_pollers ({low}) must not exceed max_pollers ({high})")
            return cls(pollers=lambda_.ProvisionedPollerConfig(
                minimum_pollers=low, maximum_pollers=high))
        if max_concurrency is not None and \
                not MIN_MAX_CONCURRENCY <= max_concurrency <= MAX_MAX_CONCURRENCY:
            raise ValueError(
                f"{who}: max_concurrency must be from {MIN_MAX_CONCURRENCY} to "
                f"{MAX_MAX_CONCURRENCY}, got {max_concurrency}"
            )
        sources = len(channel.queues)
        limit = channel.spec.max_concurrency
        if max_concurrency is None and limit is not None:
            # Each source gets its share; at least AWS's 2, so that a limit of 1 (or fewer
            # than 2 per level) still bounds the invocations, the lease doing the rest.
            max_concurrency = min(max(limit // sources, MIN_MAX_CONCURRENCY),
                                  MAX_MAX_CONCURRENCY)
        if max_concurrency is None:
            return cls()
        return cls(max_concurrency=max_concurrency, cap=max_concurrency * sources)


class LambdaConsumer(ConsumerClassFacts):
    """A Lambda function running `consumer_class` on every batch of `channel`'s queue(s).

    channel: the channel it consumes (grants: consume the queues, forward to the DLQs, the key).
    foundation: the platform key and offload bucket (grants: read offloaded payloads; read and
        delete cancel requests in the worker registry's table; write status records when the
        channel tracks status; use the idempotency table when the class is idempotent).
    code: the folder of the consumer classes (its name is their package), bundled with the
        library; third-party packages it needs come from `layers`.
    consumer_class: 'package.module:Class', `package` being the folder's name; imported at synth
        and checked against the channel as for `ConsumerService`.
    namespace: MESSENGER_NAMESPACE of the function.
    processing_timeout: the class's `processing_timeout` (default; given, it must equal it).
    timeout: the function's timeout (default: processing_timeout plus FINISH_SECONDS, rounded up
        to whole seconds); from processing_timeout + FINISH_SECONDS to 900 s, and the channel's
        visibility_timeout must be at least 6 times it.
    batch_size: messages per invocation (default 10; 1-10 on ordered channels, 1-10,000
        otherwise, above 10 only with a `max_batching_window`).
    max_batching_window: how long Lambda gathers a batch (default none; 0-300 s; not on ordered
        channels).
    max_concurrency: concurrent invocations each event source (one per queue: one per priority
        level) may start, 2-1000 (ScalingConfig.MaximumConcurrency). Default: from the channel's
        `max_concurrency` N, split over its k queues (N // k each, at least 2, at most 1000;
        where that adds up to more than N the consumers also take the shared concurrency
        lease); none without one (no limit but the account's).
    min_pollers, max_pollers: provisioned mode (ProvisionedPollerConfig): dedicated event
        pollers, from 2-200 minimum to 2-2000 maximum (AWS's defaults 2 and 200). Exclusive
        with `max_concurrency`, as AWS has it; a channel's `max_concurrency` then holds through
        the shared lease.
    memory_mib: the function's memory (default 256; CPU grows with it).
    max_message_age: the queue-age alarm's threshold (default 15 minutes).
    alarm_topic: where the alarms notify (default: nowhere; e.g. the platform's ops topic).
    layers: Lambda layers with the code's third-party packages.
    environment: extra environment variables (no secrets: they are visible in the function).
    idempotent: deprecated: the class decides (`idempotent = True` or `idempotency_key`: the role
        may use the idempotency table, else not); given, it must agree (synth fails otherwise).
    The function is named `<namespace->messenger-consumer-<its construct path and a hash>`
    (`messenger.channel.lambda_consumer_prefix`).
    Outputs: `function`, `role`, `event_sources` (one per queue), `alarms` (errors, throttles,
    and the age of the oldest message per queue), `scaling` (`EventSourceScaling`).
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        channel: Channel,
        foundation: Foundation,
        code: str | Path,
        consumer_class: str,
        namespace: str,
        processing_timeout: Duration | None = None,
        timeout: Duration | None = None,
        batch_size: int = 10,
        max_batching_window: Duration | None = None,
        max_concurrency: int | None = None,
        min_pollers: int | None = None,
        max_pollers: int | None = None,
        memory_mib: int = 256,
        max_message_age: Duration = DEFAULT_MAX_MESSAGE_AGE,
        alarm_topic: sns.ITopic | None = None,
        layers: Sequence[lambda_.ILayerVersion] = (),
        environment: Mapping[str, str] | None = None,
        idempotent: bool | None = None,
    ) -> None:
        super().__init__(scope, id)
        check_class_path(f"LambdaConsumer {id!r}", consumer_class)
        ordered = channel.spec.ordered
        largest = MAX_FIFO_BATCH if ordered else MAX_STANDARD_BATCH
        if not 1 <= batch_size <= largest:
            raise ValueError(
                f"LambdaConsumer {id!r}: batch_size must be from 1 to {largest} on "
                f"{'an ordered' if ordered else 'a standard'} channel, got {batch_size}"
            )
        if ordered and max_batching_window is not None:
            raise ValueError(
                f"LambdaConsumer {id!r}: max_batching_window is not available on an ordered "
                f"channel (SQS FIFO event sources take none); leave it out"
            )
        if batch_size > MAX_FIFO_BATCH and max_batching_window is None:
            raise ValueError(
                f"LambdaConsumer {id!r}: batch_size {batch_size} needs a max_batching_window "
                f"(Lambda gathers more than 10 messages only within one), e.g. "
                f"Duration.seconds(5)"
            )
        #: How its event sources scale, and the handlers they may run at once (`cap`).
        self.scaling = scaling = EventSourceScaling.of(
            f"LambdaConsumer {id!r}", channel, max_concurrency, min_pollers, max_pollers)
        self.channel = channel
        self.consumer_class = consumer_class
        #: The code folder, checked as a consumer image's is (same package rules).
        self.image = ConsumerImage.from_code(code)
        assert self.image.code_dir is not None
        requirements = self.image.code_dir / "requirements.txt"
        if not layers and requirements.is_file() and any(
            line.strip() and not line.lstrip().startswith("#")
            for line in requirements.read_text().splitlines()
        ):
            raise ValueError(
                f"LambdaConsumer {id!r}: {requirements} lists packages, which a Lambda bundle "
                f"does not install; give layers=[...] holding them (or run the class on "
                f"Fargate: ConsumerService's image installs them)"
            )
        self.requested_processing_timeout = processing_timeout
        self.requested_idempotent = idempotent
        self.requested_timeout = timeout
        topology = Topology.of(self)
        if self.image.contains(consumer_class):
            topology.request_consumer(self.image.code_dir, consumer_class)
        topology.attach(self, ClassValidation(self).validate, self._validate_timeouts)

        log_group = logs.LogGroup(
            self, "Logs", retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # An explicit role: the default one carries the AWS-managed basic execution policy,
        # which may write to every log group of the account.
        self.role = iam.Role(
            self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"messenger consumer {consumer_class} (Lambda)",
        )
        log_group.grant_write(self.role)
        self.environment = {
            "MESSENGER_CONSUMER": consumer_class,
            "MESSENGER_PROVISIONING": "verify",
            "MESSENGER_NAMESPACE": namespace,
            "MESSENGER_KMS_KEY": foundation.key.key_arn,
            "MESSENGER_OFFLOAD_BUCKET": foundation.offload_bucket_name,
            "POWERTOOLS_SERVICE_NAME": f"messenger-consumer-{channel.spec.name}",
            CONCURRENCY_CAP_VARIABLE: ConcurrencyCaps.of(self).add(channel.spec, scaling.cap),
            **(environment or {}),
        }
        # Named '<namespace->messenger-consumer-...' (unique per construct path): the dashboard's
        # pause may update the mappings of these functions only (IAM's lambda:FunctionArn).
        prefix = lambda_consumer_prefix(namespace)
        self.function = lambda_.Function(
            self,
            "Function",
            function_name=prefix + Names.unique_resource_name(
                self, max_length=LAMBDA_MAX_NAME_LENGTH - len(prefix), separator="-"),
            runtime=RUNTIME,
            architecture=lambda_.Architecture.X86_64,
            handler="lambdas.consumer.handler.handler",
            code=lambda_.Code.from_asset(str(consumer_lambda_bundle(self.image.code_dir))),
            role=self.role,
            log_group=log_group,
            memory_size=memory_mib,
            timeout=Duration.seconds(self.timeout_seconds),
            environment=self.environment,
            layers=list(layers),
            description=f"messenger consumer {consumer_class} on channel {channel.spec.name}",
        )
        # The same grants as a ConsumerService's task role (ECS task protection aside).
        channel.grant_consume(self.role)
        foundation.grant_offload_read(self.role)
        foundation.grant_fired_claims(self.role)  # a retried firing runs once
        foundation.grant_cancel_requests(self.role)  # an operator's cancel of a running job
        if any(level.spec.track_status for level in channel.levels):
            foundation.grant_status_write(self.role)
        if any(level.spec.keep_results for level in channel.levels):
            # its final outcomes, and whatever waits on its jobs advanced (jobs.workflows)
            foundation.grant_workflows(self.role, results=True)
        self.grant_from_class(foundation, self.role)
        # Flow control: a channel declaring a limit has its consumers run the limit gate (its
        # run-time limits, rate limiters, lease and reports in the limits table)
        if declares_limits(channel.spec):
            grant_limits_consume(self.role, channel.spec, foundation.key)
        # Mappings without the L2 event source's own grants: the channel's cover them.
        self.event_sources = [
            self.function.add_event_source_mapping(
                f"Source{index}",
                event_source_arn=queue.queue_arn,
                batch_size=batch_size,
                max_batching_window=max_batching_window,
                report_batch_item_failures=True,
                max_concurrency=scaling.max_concurrency,
                provisioned_poller_config=scaling.pollers,
            )
            for index, queue in enumerate(channel.queues)
        ]
        for mapping in self.event_sources:
            mapping.node.add_dependency(self.role)  # polling needs the grants in place
        self.alarms = self._alarms(max_message_age, alarm_topic)
        acknowledge(
            self.function,
            "AwsSolutions-L1",
            "Pinned to Python 3.11, the version the library, its bundled dependencies and the "
            "tests use; upgraded together with the project's Python.",
        )

    def _alarms(
        self, max_message_age: Duration, topic: sns.ITopic | None
    ) -> list[cloudwatch.Alarm]:
        """Errors (the function itself failed: crash, timeout, bad setup; a handler's failure is
        a batch item failure, not an error), throttles, and messages waiting too long."""
        name = self.channel.spec.name
        alarms = [
            cloudwatch.Alarm(
                self, "Errors",
                alarm_description=f"messenger Lambda consumer of {name} failed an invocation "
                                  f"(its whole batch returns to the queue): read its log.",
                metric=self.function.metric_errors(period=Duration.minutes(5), statistic="Sum"),
                threshold=1, evaluation_periods=1,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            ),
            cloudwatch.Alarm(
                self, "Throttles",
                alarm_description=f"messenger Lambda consumer of {name} is throttled (account "
                                  f"or reserved concurrency): messages wait in the queue.",
                metric=self.function.metric_throttles(period=Duration.minutes(5),
                                                      statistic="Sum"),
                threshold=1, evaluation_periods=3,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            ),
        ]
        for index, queue in enumerate(self.channel.queues):
            alarms.append(cloudwatch.Alarm(
                self, f"QueueAge{index}",
                alarm_description=f"the oldest message of {name}'s queue {index} is older than "
                                  f"{max_message_age.to_human_string()}: the consumer is behind "
                                  f"(the queue's iterator age).",
                metric=queue.metric_approximate_age_of_oldest_message(
                    period=Duration.minutes(5), statistic="Maximum"),
                threshold=max_message_age.to_seconds(), evaluation_periods=2,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            ))
        if topic is not None:
            for alarm in alarms:
                alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))
        return alarms

    @property
    def timeout_seconds(self) -> int:
        """The function's timeout in seconds (see `timeout`)."""
        if self.requested_timeout is not None:
            return math.ceil(self.requested_timeout.to_seconds())
        return math.ceil(self.processing_timeout.to_seconds() + FINISH_SECONDS)

    def _validate_timeouts(self) -> list[str]:
        spec = self.channel.spec
        target = self.consumer_class
        timeout = self.timeout_seconds
        processing = self.processing_timeout.to_seconds()
        errors = []
        if processing + FINISH_SECONDS > LAMBDA_MAX_TIMEOUT_SECONDS:
            errors.append(
                f"consumer {target!r}: processing_timeout ({processing:g} s) plus {FINISH_SECONDS} "
                f"s to finish exceeds Lambda's {LAMBDA_MAX_TIMEOUT_SECONDS} s limit; run it on "
                f"Fargate (ConsumerService) or lower processing_timeout"
            )
        elif not processing + FINISH_SECONDS <= timeout <= LAMBDA_MAX_TIMEOUT_SECONDS:
            errors.append(
                f"consumer {target!r}: the function timeout ({timeout} s) must be from "
                f"processing_timeout + {FINISH_SECONDS} s ({processing + FINISH_SECONDS:g} s; "
                f"a message may run its whole processing_timeout) to "
                f"{LAMBDA_MAX_TIMEOUT_SECONDS} s"
            )
        wanted = VISIBILITY_PER_FUNCTION_TIMEOUT * timeout
        if spec.visibility_timeout < wanted:
            errors.append(
                f"consumer {target!r} on channel {spec.name!r}: the channel's visibility_timeout "
                f"({spec.visibility_timeout} s) is less than {VISIBILITY_PER_FUNCTION_TIMEOUT} x "
                f"the function timeout ({timeout} s), AWS's guidance for an SQS event source "
                f"(a batch retried after throttling must still be leased). Raise "
                f"ChannelSpec.visibility_timeout to at least {wanted}, or lower the timeout."
            )
        return errors
