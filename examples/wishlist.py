"""Example producers and consumers of the wishlist exchange and the orders channel.

The CDK app deploys these consumers on Fargate, and ReceiptsConsumer in Lambda (examples/cdk.py,
added by app.py); `make demo`
runs them as real processes (`messenger consume examples.wishlist:AppleEventsConsumer`).
Their channel attributes come from `examples/channels.py`, the one description of the example
channels.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import ClassVar

from examples.channels import (
    WISHLIST_EXCHANGE,
    orders_channel,
    receipts_channel,
    wishlist_channels,
)
from messenger import Consumer, MultiProducer, Producer
from messenger.channel import ChannelSpec
from messenger.consume.mailbox import ReceivedMessage

logger = logging.getLogger("examples.wishlist")
_SPECS = {spec.name: spec for spec in [*wishlist_channels(), orders_channel(),
                                         receipts_channel()]}


class WishlistEventProducer(MultiProducer):
    channel = WISHLIST_EXCHANGE
    ordered = True

    def meta_headers(self) -> dict[str, str]:
        return {"locale": os.environ.get("DEMO_LOCALE", "en_GB")}


class OrdersProducer(Producer):
    channel = "orders"


class OrderReceiptsProducer(Producer):
    channel = "order_receipts"


class _WishlistConsumer(Consumer):
    processing_timeout = 30
    delay_tolerance = 120

    def handler(self, message: ReceivedMessage) -> None:
        logger.info("%s handled %s %s", type(self).__name__, message.routing_key, message.body)


class AllEventsConsumer(_WishlistConsumer):
    spec: ClassVar[ChannelSpec] = _SPECS[f"{WISHLIST_EXCHANGE}.all_events"]
    channel, ordered, message_filter, tags = spec.name, spec.ordered, spec.message_filter, spec.tags
    visibility_timeout = spec.visibility_timeout


class MobileEventsConsumer(_WishlistConsumer):
    spec: ClassVar[ChannelSpec] = _SPECS[f"{WISHLIST_EXCHANGE}.mobile_events"]
    channel, ordered, message_filter, tags = spec.name, spec.ordered, spec.message_filter, spec.tags
    visibility_timeout = spec.visibility_timeout


class AppleEventsConsumer(_WishlistConsumer):
    spec: ClassVar[ChannelSpec] = _SPECS[f"{WISHLIST_EXCHANGE}.apple_events"]
    channel, ordered, message_filter, tags = spec.name, spec.ordered, spec.message_filter, spec.tags
    visibility_timeout = spec.visibility_timeout


class OrdersConsumer(Consumer):
    """Rejects orders marked poison until the fix is 'deployed' (the file DEMO_FIX_FILE exists)."""

    spec: ClassVar[ChannelSpec] = _SPECS["orders"]
    channel, ordered, message_filter, tags = spec.name, spec.ordered, spec.message_filter, spec.tags
    visibility_timeout = spec.visibility_timeout
    processing_timeout = 30
    fix_file: ClassVar[str] = os.environ.get("DEMO_FIX_FILE", "/tmp/messenger-demo-fix")

    def handler(self, message: ReceivedMessage) -> None:
        body = message.body
        if isinstance(body, dict) and body.get("poison") and not Path(self.fix_file).exists():
            raise ValueError(f"order {body.get('order')} has no line items")
        logger.info("order %s handled", body)


class ReceiptsConsumer(Consumer):
    """Files a receipt per order; the CDK app runs it in Lambda (the same class runs on Fargate
    with `messenger consume examples.wishlist:ReceiptsConsumer`)."""

    spec: ClassVar[ChannelSpec] = _SPECS["order_receipts"]
    channel, ordered, message_filter, tags = spec.name, spec.ordered, spec.message_filter, spec.tags
    visibility_timeout = spec.visibility_timeout
    processing_timeout = 20

    def handler(self, message: ReceivedMessage) -> None:
        logger.info("receipt for order %s filed", message.body)
