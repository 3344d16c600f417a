"""The example channels and their consumers (Fargate services, a Lambda function) in the CDK app
(`app.py` adds them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import Duration

from examples.channels import example_channels
from stacks.channel_stack import ChannelStack
from stacks.consumer_image import ConsumerImage
from stacks.consumer_scaling import BacklogPerTask, FargateCapacity, StepScaling

#: The example consumer classes (module `examples.wishlist`) per example channel.
EXAMPLE_CONSUMERS = {
    "wishlist_events.all_events": "examples.wishlist:AllEventsConsumer",
    "wishlist_events.mobile_events": "examples.wishlist:MobileEventsConsumer",
    "wishlist_events.apple_events": "examples.wishlist:AppleEventsConsumer",
    "orders": "examples.wishlist:OrdersConsumer",
}
#: The example consumer classes run in Lambda instead, per channel.
EXAMPLE_LAMBDA_CONSUMERS = {"order_receipts": "examples.wishlist:ReceiptsConsumer"}
#: The folder of the example consumers (package `examples`).
EXAMPLE_CODE = Path(__file__).resolve().parent
#: Options of some example services, one of each choice (the others take the defaults:
#: on-demand, backlog-per-task scaling with the default target).
EXAMPLE_OPTIONS: dict[str, dict[str, Any]] = {
    # An order takes about 2 s and may wait 5 minutes: 150 messages per task. One task always
    # on demand, further tasks three to one on Spot.
    "orders": {
        "scaling": BacklogPerTask(average_processing_time=Duration.seconds(2),
                                  acceptable_latency=Duration.minutes(5)),
        "capacity": FargateCapacity.mix(on_demand_base=1, on_demand_weight=1, spot_weight=3),
    },
    "wishlist_events.apple_events": {"capacity": "spot"},
    "wishlist_events.mobile_events": {"scaling": StepScaling()},
}
#: The image of the example consumers: the library and this folder (package `examples`).
EXAMPLE_IMAGE = ConsumerImage.from_code(EXAMPLE_CODE)


def add_example_channels(stack: ChannelStack, namespace: str) -> None:
    """The wishlist exchange and the orders queue with a Fargate consumer service each; the
    receipts queue with a Lambda consumer."""
    for spec in example_channels(namespace):
        channel = stack.add_channel(spec)
        consumer = EXAMPLE_CONSUMERS.get(spec.name)
        if consumer is not None:
            stack.add_consumer(channel, consumer, image=EXAMPLE_IMAGE,
                               **EXAMPLE_OPTIONS.get(spec.name, {}))
        function = EXAMPLE_LAMBDA_CONSUMERS.get(spec.name)
        if function is not None:
            stack.add_lambda_consumer(channel, function, code=EXAMPLE_CODE)
