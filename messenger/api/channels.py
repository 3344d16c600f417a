"""The channels an HTTP job API serves, and the producer it runs for each.

A deployed API learns them from `MESSENGER_API_CHANNELS` (JSON written by the CDK construct
`stacks.http_enqueue.HttpEnqueue` from the channels' `ChannelSpec`s); `messenger api` from its
`--channel` options or a JSON file of the same form:

    [{"name": "greetings"},
     {"name": "jobs", "priorities": ["high", "default", "low"], "track_status": true},
     {"name": "wishlist_events", "exchange": true, "ordered": true}]

`name` is what a producer names: a queue, or an exchange (`exchange: true`, an SNS topic).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from messenger.errors import InvalidSettings
from messenger.produce.producer import MultiProducer, Producer

#: The environment variable of a deployed API's channels (the JSON above).
CHANNELS_VARIABLE = "MESSENGER_API_CHANNELS"
_FIELDS = {"name", "exchange", "ordered", "priorities", "default_priority", "track_status"}


@dataclass(frozen=True)
class ApiChannel:
    """One channel an API enqueues to.

    name: the queue or exchange a producer names (no 'exchange.queue' form).
    exchange: publish to the exchange's SNS topic (default False: a single queue).
    ordered: a FIFO channel (default False). priorities: levels, highest first (default none);
    default_priority: the level of a job that names none (default: the producer's rule).
    track_status: record QUEUED in the status table; `GET /jobs/{id}` reads it (default False).
    """

    name: str
    exchange: bool = False
    ordered: bool = False
    priorities: tuple[str, ...] = ()
    default_priority: str | None = None
    track_status: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", self.name):
            raise InvalidSettings(
                f"an API channel name is a queue or exchange name (letters, digits, '-', '_'), "
                f"got {self.name!r}"
            )

    @classmethod
    def from_dict(cls, raw: Any) -> ApiChannel:
        if not isinstance(raw, dict) or "name" not in raw or set(raw) - _FIELDS:
            raise InvalidSettings(
                f"an API channel is an object with 'name' and optionally "
                f"{', '.join(sorted(_FIELDS - {'name'}))}; got {raw!r}"
            )
        return cls(
            name=raw["name"], exchange=bool(raw.get("exchange", False)),
            ordered=bool(raw.get("ordered", False)),
            priorities=tuple(raw.get("priorities") or ()),
            default_priority=raw.get("default_priority"),
            track_status=bool(raw.get("track_status", False)),
        )

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "exchange": self.exchange, "ordered": self.ordered,
                "priorities": list(self.priorities), "default_priority": self.default_priority,
                "track_status": self.track_status}

    def producer_class(self, dedup_window: int) -> type[Producer] | type[MultiProducer]:
        """A producer class of this channel: the same `push` every Python producer runs.
        dedup_window: seconds an Idempotency-Key's job id counts as sent (`Producer.dedup`)."""
        base: type[Producer] | type[MultiProducer] = MultiProducer if self.exchange else Producer
        attributes = {
            "channel": self.name, "ordered": self.ordered, "priorities": self.priorities,
            "default_priority": self.default_priority, "track_status": self.track_status,
            "dedup_window": dedup_window, "__module__": __name__,
        }
        return type(f"Http{base.__name__}_{self.name}", (base,), attributes)


def parse_channels(text: str) -> dict[str, ApiChannel]:
    """The channels of a `MESSENGER_API_CHANNELS` JSON text, by name; InvalidSettings if the
    text is not a list of channel objects or names one twice."""
    try:
        raw = json.loads(text)
    except ValueError as error:
        raise InvalidSettings(f"{CHANNELS_VARIABLE} is not JSON: {error}") from None
    if not isinstance(raw, list):
        raise InvalidSettings(f"{CHANNELS_VARIABLE} must be a JSON list of channels")
    channels: dict[str, ApiChannel] = {}
    for item in raw:
        channel = ApiChannel.from_dict(item)
        if channel.name in channels:
            raise InvalidSettings(f"{CHANNELS_VARIABLE} names channel {channel.name!r} twice")
        channels[channel.name] = channel
    return channels


def channels_from_options(names: list[str], track_status: bool = False,
                          path: str | None = None) -> dict[str, ApiChannel]:
    """The channels of `messenger api`: single-queue channels by name (`--channel`, tracking
    status with `--status`), and those of a JSON file of `MESSENGER_API_CHANNELS`'s form."""
    channels = {}
    if path is not None:
        with open(path, encoding="utf-8") as file:
            channels.update(parse_channels(file.read()))
    for name in names:
        channels[name] = ApiChannel(name, track_status=track_status)
    if not channels:
        raise InvalidSettings("name the channels to serve: --channel NAME (repeatable) or "
                              "--channels FILE")
    return channels
