"""Choosing dead letters by what they say, and finding them across channels.

    chosen = select(DeadLetterWorkbench('orders'), LetterFilter(error_type='ValueError'))
    chosen.ids                      # the SQS MessageIds an action would name: the preview
    found = search(clients, settings, SearchQuery(text='card declined'))
    found.requests                  # what the search cost, in AWS requests

A filter reads the letters one scan of the workbench returns (at most `limit`, so a DLQ of
10,000 is never read whole for a preview) and keeps those that match every field given. What it
returns is exactly what an action would then name, by SQS MessageId: the action itself goes
through `DeadLetterWorkbench.requeue`/`delete`, which check again that each one is still there.

A search reads up to `per_channel` letters of each channel whose DLQs hold any (found with one
queue snapshot of the namespace; and, for a job id, the status timeline), several channels at
once (`read_channels`): its cost is bounded and counted. Letters in flight elsewhere at that
moment are not seen. An offloaded body is not fetched from S3 to be searched (counted in
`offloaded_skipped`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from messenger.aws import ClientFactory, RequestCounter
from messenger.errors import ChannelNotFound, InvalidSettings
from messenger.jobs.status import StatusRecord, StatusStore
from messenger.operations.deadletters import (
    DeadLetter,
    DeadLetterListing,
    DeadLetterWorkbench,
    read_channels,
)
from messenger.operations.snapshot import snapshot
from messenger.settings import Settings

#: Letters a preview reads at most (one scan), and by default.
MAX_SCAN = 1000
DEFAULT_SCAN = 200
#: A search reads at most this many letters per channel, and this many channels.
DEFAULT_PER_CHANNEL = 100
MAX_CHANNELS = 100
#: Longest filter value accepted (a body field path, a text to find).
MAX_VALUE_LENGTH = 200
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_age(text: str, name: str) -> float | None:
    """'90s', '15m', '2h', '3d' or seconds as seconds; '' as None; InvalidSettings otherwise."""
    if not text.strip():
        return None
    found = _AGE.match(text)
    if not found:
        raise InvalidSettings(f"{name} is a duration such as 90s, 15m, 2h or 3d, got {text!r}")
    return float(found.group(1)) * _UNITS[found.group(2)]


def _value(text: str, name: str) -> str:
    if len(text) > MAX_VALUE_LENGTH or not text.isprintable():
        raise InvalidSettings(f"{name} is at most {MAX_VALUE_LENGTH} printable characters")
    return text.strip()


@dataclass(frozen=True)
class LetterFilter:
    """Which dead letters to choose; every field given must match ('' / None: any).

    reason: text in the letter's reason (case-insensitive). error_type: the exception's class
    name, exactly (a redriven letter's last recorded error counts too). older_than /
    younger_than: age bounds in seconds. body_field: a dotted path into a JSON body
    ('customer.id'); body_value: what it must equal (as text; '' with a field: the field exists).
    text: text anywhere in the body or the error (case-insensitive).
    """

    reason: str = ""
    error_type: str = ""
    older_than: float | None = None
    younger_than: float | None = None
    body_field: str = ""
    body_value: str = ""
    text: str = ""

    @classmethod
    def from_form(cls, form: Mapping[str, Any]) -> LetterFilter:
        """A filter from a form's fields (reason, error_type, older_than, younger_than,
        body_field, body_value, text); InvalidSettings says which field is wrong."""

        def get(name: str) -> str:
            value = form.get(name) or ""
            return _value(str(value), name.replace("_", " "))

        chosen = cls(reason=get("reason"), error_type=get("error_type"),
                     older_than=parse_age(get("older_than"), "older than"),
                     younger_than=parse_age(get("younger_than"), "younger than"),
                     body_field=get("body_field"), body_value=get("body_value"),
                     text=get("text"))
        if chosen.body_value and not chosen.body_field:
            raise InvalidSettings("body value needs a body field (a dotted path such as "
                                  "customer.id)")
        if chosen.body_field and not re.fullmatch(r"[\w-]+(\.[\w-]+)*", chosen.body_field):
            raise InvalidSettings(f"body field is a dotted path of names such as customer.id, "
                                  f"got {chosen.body_field!r}")
        if chosen.older_than is not None and chosen.younger_than is not None \
                and chosen.older_than >= chosen.younger_than:
            raise InvalidSettings("older than must be less than younger than (no letter is both)")
        return chosen

    @property
    def empty(self) -> bool:
        return self == LetterFilter()

    def describe(self) -> str:
        """The filter in words ('every letter' when empty)."""
        parts = []
        if self.reason:
            parts.append(f"reason contains {self.reason!r}")
        if self.error_type:
            parts.append(f"error type {self.error_type}")
        if self.older_than is not None:
            parts.append(f"older than {self.older_than:g} s")
        if self.younger_than is not None:
            parts.append(f"younger than {self.younger_than:g} s")
        if self.body_field:
            parts.append(f"body {self.body_field} = {self.body_value!r}" if self.body_value
                         else f"body has {self.body_field}")
        if self.text:
            parts.append(f"text {self.text!r}")
        return ", ".join(parts) or "every letter"

    def matches(self, letter: DeadLetter, now: float | None = None) -> bool:
        if self.reason and self.reason.lower() not in letter.reason.lower():
            return False
        if self.error_type and self.error_type not in (
                letter.error_type, letter.last_error.split(":", 1)[0].strip()):
            return False
        age = letter.age_seconds(now)
        if self.older_than is not None and (age is None or age < self.older_than):
            return False
        if self.younger_than is not None and (age is None or age > self.younger_than):
            return False
        if self.body_field and not self._field_matches(letter):
            return False
        if self.text:
            haystack = "\n".join((letter.body, letter.error_message, letter.traceback,
                                  letter.last_error, letter.id)).lower()
            if self.text.lower() not in haystack:
                return False
        return True

    def _field_matches(self, letter: DeadLetter) -> bool:
        if letter.offloaded:
            return False  # the body is in S3: not read for a filter
        try:
            value: Any = json.loads(letter.body)
        except ValueError:
            return False
        for part in self.body_field.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                return False
        if not self.body_value:
            return True
        text = value if isinstance(value, str) else json.dumps(value)
        return text == self.body_value


@dataclass
class Selection:
    """The letters of one scan that a filter chose: exactly what an action would name."""

    channel: str
    filter: LetterFilter
    letters: list[DeadLetter]
    listing: DeadLetterListing
    limit: int

    @property
    def ids(self) -> list[str]:
        """The SQS MessageIds of the chosen letters (each names exactly one message)."""
        return [letter.sqs_message_id for letter in self.letters]

    @property
    def scanned(self) -> int:
        return len(self.listing.letters)

    def summary(self) -> str:
        line = (f"{len(self.letters)} of {self.scanned} dead letter(s) read match "
                f"{self.filter.describe()}")
        if self.listing.stopped_at_limit:
            line += f" (read stopped at {self.limit}: there may be more; run again after acting)"
        if self.listing.not_seen:
            line += f"; {self.listing.not_seen} could not be seen"
        return line


def select(workbench: DeadLetterWorkbench, chosen: LetterFilter,
           limit: int = DEFAULT_SCAN) -> Selection:
    """The letters of `workbench`'s channel matching `chosen`, from one scan of at most `limit`
    (1 to MAX_SCAN) letters, released before this returns."""
    if not 1 <= limit <= MAX_SCAN:
        raise InvalidSettings(f"limit must be 1 to {MAX_SCAN}, got {limit}")
    listing = workbench.list(limit=limit)
    now = time.time()
    letters = [letter for letter in listing.letters if chosen.matches(letter, now)]
    return Selection(workbench.channel, chosen, letters, listing, limit)


# -- search across channels ----------------------------------------------------------------------
@dataclass(frozen=True)
class SearchQuery:
    """job_id: a messenger message id or SQS MessageId, exactly; error_type: an exception class
    name; text: text in a letter's body or error (case-insensitive). At least one."""

    job_id: str = ""
    error_type: str = ""
    text: str = ""

    @classmethod
    def from_form(cls, form: Mapping[str, Any]) -> SearchQuery:
        query = cls(**{name: _value(str(form.get(name) or ""), name.replace("_", " "))
                       for name in ("job_id", "error_type", "text")})
        if not (query.job_id or query.error_type or query.text):
            raise InvalidSettings("search for a job id, an error type or a text")
        return query

    def matches(self, letter: DeadLetter) -> bool:
        if self.job_id and self.job_id not in (letter.id, letter.sqs_message_id):
            return False
        return LetterFilter(error_type=self.error_type, text=self.text).matches(letter)


@dataclass
class SearchResult:
    """What a search found and what it cost (AWS requests by operation)."""

    query: SearchQuery
    letters: list[tuple[str, DeadLetter]] = field(default_factory=list)  # (channel, letter)
    timeline: list[StatusRecord] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # channels read only up to per_channel
    offloaded_skipped: int = 0
    scanned: int = 0
    request_counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.request_counts.values())


def search(clients: ClientFactory, settings: Settings, query: SearchQuery,
           per_channel: int = DEFAULT_PER_CHANNEL) -> SearchResult:
    """Dead letters matching `query` in every channel of the namespace (each channel's DLQs read
    up to `per_channel` letters, 1 to MAX_SCAN), plus a job id's status timeline. `clients` should
    be a factory of the search's own: its requests are what the result counts."""
    if not 1 <= per_channel <= MAX_SCAN:
        raise InvalidSettings(f"per_channel must be 1 to {MAX_SCAN}, got {per_channel}")
    started = time.monotonic()
    counter = RequestCounter().attach(clients)
    result = SearchResult(query)
    try:
        if query.job_id:
            store = StatusStore(clients, settings)
            if store.exists():
                result.timeline = store.timeline(query.job_id)
        # Only channels whose DLQs hold something are opened: an empty DLQ's receive would wait
        # a second for nothing (100 empty channels took 100 s before this).
        rows = snapshot(clients, settings)
        channels = sorted({row.channel for row in rows})
        result.channels = channels[:MAX_CHANNELS]
        holding = {row.channel for row in rows if row.dlq_depth}
        opened = [name for name in result.channels if name in holding]

        def read(name: str) -> DeadLetterListing | None:
            try:
                return DeadLetterWorkbench(name, settings, clients).list(limit=per_channel)
            except ChannelNotFound:
                return None  # a channel without a DLQ

        # The channels are read at once (each ends with a 1 s long poll), listed in their order.
        for name, listing in zip(opened, read_channels(opened, read), strict=True):
            if listing is None:
                continue
            result.scanned += len(listing.letters)
            if listing.stopped_at_limit:
                result.truncated.append(name)
            for letter in listing.letters:
                if letter.offloaded and query.text:
                    result.offloaded_skipped += 1
                if query.matches(letter):
                    result.letters.append((name, letter))
    finally:
        counter.detach(clients)
    result.request_counts = dict(sorted(counter.counts.items()))
    result.seconds = time.monotonic() - started
    return result
