"""The example channels, described once: the CDK app deploys them, `make demo` provisions them.

This module imports only `messenger.channel`, so the CDK app can use it without the runtime.
"""

from __future__ import annotations

from messenger.channel import ChannelSpec, ChannelTags, MessageFilter

WISHLIST_EXCHANGE = "wishlist_events"
WISHLIST_OWNER = ChannelTags(owner="wishlist-team", team="wishlist", alarm_threshold=100)


def wishlist_channels(namespace: str = "") -> list[ChannelSpec]:
    """The ordered wishlist exchange with three filtered consumer queues."""
    return [
        ChannelSpec(
            f"{WISHLIST_EXCHANGE}.all_events",
            ordered=True,
            namespace=namespace,
            tags=WISHLIST_OWNER,
        ),
        ChannelSpec(
            f"{WISHLIST_EXCHANGE}.mobile_events",
            ordered=True,
            namespace=namespace,
            message_filter=MessageFilter("prefix", ["MOBILE."]),
            tags=WISHLIST_OWNER,
        ),
        ChannelSpec(
            f"{WISHLIST_EXCHANGE}.apple_events",
            ordered=True,
            namespace=namespace,
            message_filter=MessageFilter("exact", ["MOBILE.APPLE"]),
            tags=ChannelTags(
                owner="wishlist-team", team="wishlist", alarm_threshold=50, critical=True
            ),
        ),
    ]


def orders_channel(namespace: str = "") -> ChannelSpec:
    """A single-consumer channel."""
    return ChannelSpec(
        "orders", namespace=namespace, tags=ChannelTags(owner="orders-team", team="orders")
    )


def receipts_channel(namespace: str = "") -> ChannelSpec:
    """A single-consumer channel consumed by Lambda (examples/cdk.py): its visibility timeout is
    at least 6 times the function's timeout (processing_timeout 20 s + 3 s)."""
    return ChannelSpec(
        "order_receipts", namespace=namespace, visibility_timeout=150,
        tags=ChannelTags(owner="orders-team", team="orders"),
    )


def example_channels(namespace: str = "") -> list[ChannelSpec]:
    return [*wishlist_channels(namespace), orders_channel(namespace), receipts_channel(namespace)]
