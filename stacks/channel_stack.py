"""`ChannelStack`: a group of channels, their consumers and one dashboard.

```python
stack = ChannelStack(app, "Orders", platform=platform, code="orders")  # the team's folder
orders = stack.add_channel(ChannelSpec("orders"))                       # one line per channel
stack.add_consumer(orders, "orders.consumers:OrderConsumer")          # one line per consumer
receipts = stack.add_channel(ChannelSpec("receipts", visibility_timeout=150))
stack.add_lambda_consumer(receipts, "orders.consumers:ReceiptConsumer")  # a consumer in Lambda
```

CloudFormation allows 500 resources per stack. A channel is 5 resources (queue, DLQ, two
TLS-only queue policies, subscription; times its priority levels), a consumer about 10: keep a
stack to about 80 channels and split larger sets into several ChannelStacks (by team or domain).
Channels of one exchange may live in different stacks; they share the exchange's topic.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aws_cdk import Duration, Environment, RemovalPolicy, Stack, Tags
from constructs import Construct

from messenger.channel import TAG_MANAGED, ChannelSpec
from messenger.schedule_spec import RecurringSchedule
from stacks.channel import Channel, construct_id
from stacks.consumer_image import ConsumerImage
from stacks.consumer_service import ConsumerService
from stacks.dashboard import ChannelDashboard
from stacks.http_enqueue import HttpEnqueue
from stacks.lambda_consumer import LambdaConsumer
from stacks.platform_stack import PlatformStack
from stacks.schedules import RecurringJob


class ChannelStack(Stack):
    """Channels of one namespace (the platform's), their consumers (Fargate services or Lambda
    functions) and a dashboard.

    platform: the namespace's PlatformStack (key, bucket, cluster). The stack deploys to the
        platform's environment (account and region): it uses the platform's key and cluster,
        which CloudFormation cannot reference across environments. An `env` that differs fails.
    code: the folder of this stack's consumer classes (`ConsumerImage.from_code(code)`), or a
        `ConsumerImage`; the default image of `add_consumer` and code of `add_lambda_consumer`.
    """

    def __init__(
        self, scope: Construct, id: str, *, platform: PlatformStack,
        code: str | Path | ConsumerImage | None = None, **kwargs: Any
    ) -> None:
        env = kwargs.pop("env", None)
        if env is not None and not _same_environment(env, platform.deploy_env):
            raise ValueError(
                f"ChannelStack {id!r}: env {_describe(env)} differs from the platform's "
                f"{_describe(platform.deploy_env)}; a channel stack uses the platform's key and "
                f"cluster, so it deploys where the platform does. Leave env out."
            )
        super().__init__(scope, id, env=platform.deploy_env, **kwargs)
        self.platform = platform
        self.namespace = platform.namespace
        if code is not None and not isinstance(code, ConsumerImage):
            code = ConsumerImage.from_code(code)
        self.code = code
        self.channels: dict[str, Channel] = {}
        self.consumers: dict[str, ConsumerService] = {}
        self.lambda_consumers: dict[str, LambdaConsumer] = {}
        self.schedules: dict[str, RecurringJob] = {}
        self.dashboard = ChannelDashboard(
            self, "Dashboard", dashboard_name=f"{self.stack_name}-channels"
        )
        Tags.of(self).add(TAG_MANAGED, "true")

    def add_channel(
        self, spec: ChannelSpec, removal_policy: RemovalPolicy = RemovalPolicy.RETAIN
    ) -> Channel:
        """Deploy `spec` in the platform's namespace (a spec without namespace gets it).

        removal_policy: RETAIN (default) keeps the queues, DLQs and topic, with their messages,
        when the stack is deleted or they are replaced; DESTROY deletes them."""
        if not spec.namespace:
            spec = spec.with_namespace(self.namespace)
        elif spec.namespace != self.namespace:
            raise ValueError(
                f"channel {spec.name!r} has namespace {spec.namespace!r}; this stack deploys "
                f"namespace {self.namespace!r}"
            )
        if spec.name in self.channels:
            raise ValueError(f"channel {spec.name!r} is already in stack {self.stack_name}")
        channel = Channel(
            self, f"Channel{construct_id(spec.name, spec.ordered)}", spec=spec,
            key=self.platform.foundation.key, removal_policy=removal_policy,
        )
        self.channels[spec.name] = channel
        self.dashboard.add_channel(channel)
        return channel

    def add_consumer(
        self, channel: Channel, consumer_class: str,
        image: str | Path | ConsumerImage | None = None, **options: Any
    ) -> ConsumerService:
        """Run `consumer_class` ('package.module:Class') on Fargate.

        image: the code folder or `ConsumerImage` (default: the stack's `code`).
        options: ConsumerService's (processing_timeout, concurrency, cpu, ...)."""
        if image is None:
            image = self.code
        if image is None:
            raise ValueError(
                f"ChannelStack {self.stack_name!r}: add_consumer({consumer_class!r}) needs the "
                f"service's code: ChannelStack(..., code='path/to/folder') or "
                f"add_consumer(..., image=ConsumerImage.from_code(...) or .from_image(...))"
            )
        if not isinstance(image, ConsumerImage):
            image = ConsumerImage.from_code(image)
        service = ConsumerService(
            self,
            f"Consumer{construct_id(channel.spec.name, channel.spec.ordered)}",
            channel=channel,
            foundation=self.platform.foundation,
            cluster=self.platform.cluster,
            image=image,
            consumer_class=consumer_class,
            namespace=self.namespace,
            **options,
        )
        self.consumers[channel.spec.name] = service
        return service

    def add_lambda_consumer(
        self, channel: Channel, consumer_class: str, code: str | Path | None = None,
        **options: Any
    ) -> LambdaConsumer:
        """Run `consumer_class` ('package.module:Class') in Lambda on the channel's queue(s).

        code: the folder of the class (default: the stack's `code`). Its alarms notify the
        platform's ops alarm topic. options: LambdaConsumer's (timeout, batch_size, ...)."""
        if code is None and self.code is not None:
            code = self.code.code_dir
        if code is None:
            raise ValueError(
                f"ChannelStack {self.stack_name!r}: add_lambda_consumer({consumer_class!r}) "
                f"needs the consumer's code folder: ChannelStack(..., code='path/to/folder') or "
                f"add_lambda_consumer(..., code='path/to/folder')"
            )
        options.setdefault("alarm_topic", self.platform.ops.alarm_topic)
        function = LambdaConsumer(
            self,
            f"LambdaConsumer{construct_id(channel.spec.name, channel.spec.ordered)}",
            channel=channel,
            foundation=self.platform.foundation,
            code=code,
            consumer_class=consumer_class,
            namespace=self.namespace,
            **options,
        )
        self.lambda_consumers[channel.spec.name] = function
        return function

    def add_http_enqueue(self, channels: Sequence[Channel], id: str = "HttpEnqueue",
                         **options: Any) -> HttpEnqueue:
        """An HTTP API that puts jobs on `channels` (stacks/http_enqueue.py): a Regional REST
        API, IAM (SigV4) on every method unless `options` name a Cognito user pool or an
        unauthenticated route. options: HttpEnqueue's (throttle_rate, usage_plan, ...)."""
        options.setdefault("schedules", self.platform.schedules)  # jobs with at/delay_seconds
        return HttpEnqueue(self, id, channels=channels, foundation=self.platform.foundation,
                           namespace=self.namespace, **options)

    def add_schedule(
        self, channel: Channel, name: str, *, cron: str | None = None,
        rate: Duration | None = None, timezone: str | None = None, body: Any = None,
        routing_key: str | None = None,
    ) -> RecurringJob:
        """Push `body` to `channel` on a calendar (`cron`: EventBridge's six fields, read in
        `timezone`, default UTC) or every `rate` (whole minutes); one Scheduler schedule named
        `name` in the namespace's group. Each firing's job id is '<name>@<scheduled time>'."""
        job = RecurringSchedule.of(
            name, cron=cron, rate_seconds=None if rate is None else rate.to_seconds(),
            timezone=timezone, body=body, routing_key=routing_key)
        if name in self.schedules:
            raise ValueError(f"schedule {name!r} is already in stack {self.stack_name}")
        recurring = RecurringJob(self, f"Schedule{construct_id(name)}",
                                 channel=channel, job=job, wiring=self.platform.schedules)
        self.schedules[name] = recurring
        return recurring



def _same_environment(env: Any, other: Environment | None) -> bool:
    def parts(value: Any) -> tuple[Any, Any]:
        if value is None:
            return None, None
        if isinstance(value, dict):
            return value.get("account"), value.get("region")
        return value.account, value.region

    return parts(env) == parts(other)


def _describe(env: Any) -> str:
    return "(environment-agnostic)" if env is None else repr(env)
