"""The example channels and their consumer services in the CDK app (`app.py` adds them)."""

from __future__ import annotations

from pathlib import Path

from examples.channels import example_channels
from stacks.channel_stack import ChannelStack
from stacks.consumer_image import ConsumerImage

#: The example consumer classes (module `examples.wishlist`) per example channel.
EXAMPLE_CONSUMERS = {
    "wishlist_events.all_events": "examples.wishlist:AllEventsConsumer",
    "wishlist_events.mobile_events": "examples.wishlist:MobileEventsConsumer",
    "wishlist_events.apple_events": "examples.wishlist:AppleEventsConsumer",
    "orders": "examples.wishlist:OrdersConsumer",
}
#: The image of the example consumers: the library and this folder (package `examples`).
EXAMPLE_IMAGE = ConsumerImage.from_code(Path(__file__).resolve().parent)


def add_example_channels(stack: ChannelStack, namespace: str) -> None:
    """The wishlist exchange, the orders queue and a Fargate consumer service for each."""
    for spec in example_channels(namespace):
        channel = stack.add_channel(spec)
        consumer = EXAMPLE_CONSUMERS.get(spec.name)
        if consumer is not None:
            stack.add_consumer(channel, consumer, image=EXAMPLE_IMAGE)
