"""Compose the app from a `MessengerConfig`: platform, a channel stack, EMR pipeline, cdk-nag.

The channels come from the caller (`app.py` adds the examples); this module never imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aws_cdk import App, Environment, Validations
from cdk_nag import AwsSolutionsChecks

from stacks.channel_stack import ChannelStack
from stacks.config import MessengerConfig
from stacks.pipeline_stack import PipelineStack
from stacks.platform_stack import PlatformStack

#: Adds channels (and their consumers) to a channel stack, given the namespace.
ChannelSetup = Callable[[ChannelStack, str], None]


@dataclass(frozen=True)
class MessengerStacks:
    platform: PlatformStack
    examples: ChannelStack | None
    pipeline: PipelineStack | None


def build_app(
    app: App, config: MessengerConfig, channels: ChannelSetup | None = None
) -> MessengerStacks:
    """Add the stacks of `config` to `app`, with the cdk-nag AwsSolutions pack on every stack.

    channels: fills the `<prefix>MessengerExamples` channel stack (None, or
    `config.example_channels` false: no such stack).
    """
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    env = Environment(account=config.account, region=config.region)
    prefix = config.stack_prefix
    platform = PlatformStack(app, f"{prefix}MessengerPlatform", config=config, env=env)
    examples = None
    if config.example_channels and channels is not None:
        examples = ChannelStack(app, f"{prefix}MessengerExamples", platform=platform, env=env)
        channels(examples, config.namespace)
    pipeline = None
    if config.pipeline:
        publishes_to = list(examples.channels.values()) if examples else []
        pipeline = PipelineStack(
            app, f"{prefix}MessengerPipeline", platform=platform, channels=publishes_to, env=env
        )
    return MessengerStacks(platform, examples, pipeline)
