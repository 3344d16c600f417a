"""Compose the app from a `MessengerConfig`: platform, example channels, EMR pipeline, cdk-nag."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import App, Duration, Environment, Validations
from cdk_nag import AwsSolutionsChecks

from examples.channels import example_channels
from stacks.channel_stack import ChannelStack
from stacks.config import MessengerConfig
from stacks.pipeline_stack import PipelineStack
from stacks.platform_stack import PlatformStack

#: The example consumer classes (module `examples.wishlist`) per example channel.
EXAMPLE_CONSUMERS = {
    "wishlist_events.all_events": "examples.wishlist:AllEventsConsumer",
    "wishlist_events.mobile_events": "examples.wishlist:MobileEventsConsumer",
    "wishlist_events.apple_events": "examples.wishlist:AppleEventsConsumer",
    "orders": "examples.wishlist:OrdersConsumer",
}
#: The example classes' `processing_timeout`.
EXAMPLE_PROCESSING_TIMEOUT = Duration.seconds(30)


@dataclass(frozen=True)
class MessengerStacks:
    platform: PlatformStack
    examples: ChannelStack | None
    pipeline: PipelineStack | None


def build_app(app: App, config: MessengerConfig) -> MessengerStacks:
    """Add the stacks of `config` to `app`, with the cdk-nag AwsSolutions pack on every stack."""
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    env = Environment(account=config.account, region=config.region)
    prefix = config.stack_prefix
    platform = PlatformStack(app, f"{prefix}MessengerPlatform", config=config, env=env)
    examples = None
    if config.example_channels:
        examples = ChannelStack(app, f"{prefix}MessengerExamples", platform=platform, env=env)
        for spec in example_channels(config.namespace):
            channel = examples.add_channel(spec)
            consumer = EXAMPLE_CONSUMERS.get(spec.name)
            if consumer is not None:
                examples.add_consumer(
                    channel, consumer, processing_timeout=EXAMPLE_PROCESSING_TIMEOUT
                )
    pipeline = None
    if config.pipeline:
        publishes_to = list(examples.channels.values()) if examples else []
        pipeline = PipelineStack(
            app, f"{prefix}MessengerPipeline", platform=platform, channels=publishes_to, env=env
        )
    return MessengerStacks(platform, examples, pipeline)
