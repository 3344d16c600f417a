"""Channels' flow-control limits as operators see them: what holds now (set at run time, else
declared), the consumers' current rate and the jobs waiting on a limit (`messenger top`, the
dashboard's channel page, `messenger limits`).

    channel_limits(clients, settings, "orders")   # LimitsView, None: no such channel
    namespace_limits(clients, settings)           # every channel with a limit, by name

A channel is resolved from its queues' tags (`messenger.operations.queues`): a priority level's
name gives its channel, whose limits hold for every level, and its declaration is read from the
tags of its queues (`ChannelLimits.of_tags`), a prioritized channel's levels included. Before
the limits table exists (no consumer or operator used it yet in this namespace) a channel's
limits are its declaration, and no consumer reported.

Only a channel that declares a limit has its consumers run the limit gate, so only its limits
can be changed at run time (`require_declared`).
"""

from __future__ import annotations

import dataclasses

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, error_code
from messenger.errors import ChannelNotFound, InvalidSettings
from messenger.jobs.limits import LIMIT_FIELDS, ChannelLimits, LimitStore, LimitsView
from messenger.operations.queues import ChannelQueue, channel_queues
from messenger.ops.inventory import list_platform_resources
from messenger.settings import Settings


def _declarations(clients: ClientFactory, settings: Settings) -> dict[str, ChannelLimits]:
    """Each channel's declaration from its queues' tags (one tag query)."""
    found: dict[str, ChannelLimits] = {}
    for resource in list_platform_resources(clients, settings.namespace, roles=("queue",)):
        found.setdefault(ChannelQueue.from_resource(resource).channel,
                         ChannelLimits.of_tags(resource.tags))
    return found


def _show(store: LimitStore, channel: str, declared: ChannelLimits) -> LimitsView:
    """The channel's view with `declared` as its declaration: what an operator set holds, the
    declaration elsewhere."""
    try:
        view = store.show(channel)
    except ClientError as error:
        if error_code(error) != "ResourceNotFoundException":
            raise
        return LimitsView(channel, declared, declared)
    holding = {name: getattr(view.limits if name in view.overrides else declared, name)
               for name in LIMIT_FIELDS}
    return dataclasses.replace(view, limits=ChannelLimits(**holding), declared=declared)


def channel_limits(clients: ClientFactory, settings: Settings, name: str) -> LimitsView | None:
    """The limits of the channel `name` names (a level's or a queue's name gives its channel);
    None when no queue of the namespace is tagged with it."""
    try:
        channel = channel_queues(clients, settings, name)[0].channel
    except ChannelNotFound:
        return None
    declared = _declarations(clients, settings).get(channel, ChannelLimits())
    return _show(LimitStore(clients, settings), channel, declared)


def require_declared(view: LimitsView) -> None:
    """Refuse a limit set at run time on a channel that declares none: its consumers run no
    limit gate, so they would read nothing (InvalidSettings saying what to do instead)."""
    if not view.declared.limited:
        raise InvalidSettings(
            f"channel {view.channel!r} declares no limit, so its consumers read none at run "
            f"time: declare one (ChannelSpec rate_limit, tenant_rate_limit or max_concurrency) "
            f"and deploy, then change it here")


def namespace_limits(clients: ClientFactory, settings: Settings) -> list[LimitsView]:
    """Every channel of the namespace that declares a limit (the others run no limit gate), by
    name, with what holds now (a limit set off at run time shows as none): one tag query, then
    each such channel's limits and reports."""
    store = LimitStore(clients, settings)
    return [_show(store, channel, declared)
            for channel, declared in sorted(_declarations(clients, settings).items())
            if declared.limited]
