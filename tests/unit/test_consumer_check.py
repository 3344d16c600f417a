"""The consumer-class path check both consumer constructs share (`stacks.consumer_check`)."""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
import pytest

from messenger.channel import ChannelSpec
from stacks.channel import Channel
from stacks.consumer_check import check_class_path
from stacks.foundation import Foundation
from stacks.lambda_consumer import LambdaConsumer


@pytest.mark.parametrize("target", ["team.consumers:Orders", "team:Orders", "a.b.c:_Private"])
def test_a_module_path_and_a_class_name_pass(target: str) -> None:
    check_class_path("ConsumerService 'Orders'", target)


@pytest.mark.parametrize("target", ["team.consumers", "team.consumers:", ":Orders",
                                    "team-x.consumers:Orders", "team..consumers:Orders",
                                    "team.consumers:Orders.handler", "team.consumers:1st"])
def test_anything_else_is_named_with_its_construct(target: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_class_path("LambdaConsumer 'Orders'", target)
    assert str(refused.value) == (f"LambdaConsumer 'Orders': consumer_class must be "
                                  f"'package.module:Class', got {target!r}")


def test_the_lambda_consumer_checks_the_path_as_the_fargate_service_does(tmp_path: Path) -> None:
    # Given a stack with a channel
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "Bad", env=cdk.Environment(account="111111111111", region="eu-west-1"))
    foundation = Foundation(stack, "Foundation", namespace="")
    channel = Channel(stack, "Channel", spec=ChannelSpec("orders"), key=foundation.key)
    # When a Lambda consumer names its class without ':Class'
    with pytest.raises(ValueError) as refused:
        LambdaConsumer(stack, "Consumer", channel=channel, foundation=foundation,
                       code=tmp_path, consumer_class="examples.wishlist", namespace="")
    # Then the shared check refuses it, naming the construct
    assert str(refused.value).startswith("LambdaConsumer 'Consumer': consumer_class must be")
