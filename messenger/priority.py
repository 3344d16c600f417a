"""Polling the levels of a prioritized channel: higher levels first, lower ones never starved.

Each poll serves one level. `PriorityPolicy` decides which: 'weighted' (default) picks levels by
smooth weighted round-robin, so that with a backlog everywhere the polls (and, full polls being
equal, the messages) follow the weights, e.g. {'high': 4, 'default': 2, 'low': 1} serves high 4 of
every 7 polls and low 1; 'strict' always serves the highest level that has messages.

`LevelPoller` makes the SQS calls: it short-polls (WaitTimeSeconds=0) the chosen level, then the
others from the highest down, and returns the first level's messages it gets. Only when every level
came back empty does it long-poll, on the level the policy chose, so an empty level never holds up
the others for a 20 s long poll. A level found empty is skipped for `recheck_seconds` (1 s) while
another level has messages, which keeps the requests per message near one poll per batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from messenger.errors import InvalidChannelSpec
from messenger.mailbox import Mailbox

PRIORITY_MODES: tuple[str, ...] = ("weighted", "strict")
#: Seconds an empty level is skipped while another level has messages.
RECHECK_SECONDS = 1.0


def default_weights(levels: Sequence[str]) -> dict[str, int]:
    """Weights halving from level to level: 3 levels → {first: 4, second: 2, third: 1}."""
    return {level: 2 ** (len(levels) - 1 - i) for i, level in enumerate(levels)}


class PriorityPolicy:
    """Which level a poll serves.

    levels: the channel's levels, highest first. weights: a whole number >= 1 per level (None:
    `default_weights`). mode: 'weighted' or 'strict'. owner: the name used in error messages.
    """

    def __init__(
        self,
        levels: Sequence[str],
        weights: Mapping[str, int] | None = None,
        mode: str = "weighted",
        owner: str = "consumer",
    ) -> None:
        self.levels = tuple(levels)
        if mode not in PRIORITY_MODES:
            raise InvalidChannelSpec(
                f"{owner}.priority_mode {mode!r} is not one of {', '.join(PRIORITY_MODES)}"
            )
        self.mode = mode
        self.weights = self._check_weights(weights, owner)
        self._current = dict.fromkeys(self.levels, 0)
        self._lock = threading.Lock()

    def _check_weights(self, weights: Mapping[str, int] | None, owner: str) -> dict[str, int]:
        if weights is None:
            return default_weights(self.levels)
        if not isinstance(weights, Mapping):
            raise InvalidChannelSpec(
                f"{owner}.priority_weights must map each level ({', '.join(self.levels)}) to a "
                f"weight, got {weights!r}"
            )
        for level, weight in weights.items():
            if level not in self.levels:
                raise InvalidChannelSpec(
                    f"{owner}.priority_weights names {level!r}, which is not one of "
                    f"{', '.join(self.levels)}"
                )
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                raise InvalidChannelSpec(
                    f"{owner}.priority_weights[{level!r}] must be a whole number >= 1, "
                    f"got {weight!r}"
                )
        missing = [level for level in self.levels if level not in weights]
        if missing:
            raise InvalidChannelSpec(
                f"{owner}.priority_weights gives no weight to {', '.join(missing)}; every level "
                f"({', '.join(self.levels)}) needs one"
            )
        return {level: int(weights[level]) for level in self.levels}

    def pick(self) -> str:
        """The level this poll serves first (smooth weighted round-robin, or the highest)."""
        if self.mode == "strict":
            return self.levels[0]
        with self._lock:
            total = 0
            for level in self.levels:
                self._current[level] += self.weights[level]
                total += self.weights[level]
            chosen = max(self.levels, key=lambda level: self._current[level])
            self._current[chosen] -= total
            return chosen

    def order(self) -> list[str]:
        """Levels in the order one poll tries them: the pick, then the rest from the highest."""
        first = self.pick()
        return [first, *(level for level in self.levels if level != first)]


@dataclass(frozen=True)
class LevelBatch:
    """What one poll got: the messages of one level, and when the poll that got them began."""

    mailbox: Mailbox
    messages: list[dict[str, Any]]
    polled_at: float


class LevelPoller:
    """Polls the mailboxes of a channel's levels (each with its `level` set) per a policy."""

    def __init__(
        self,
        mailboxes: Sequence[Mailbox],
        policy: PriorityPolicy,
        recheck_seconds: float = RECHECK_SECONDS,
    ) -> None:
        self.by_level = {box.level: box for box in mailboxes}
        if tuple(self.by_level) != policy.levels:
            raise ValueError(f"mailboxes {tuple(self.by_level)} do not match {policy.levels}")
        self.policy = policy
        self.recheck_seconds = recheck_seconds
        self._empty_until: dict[str, float] = {}

    def poll(self, count: int, wait_seconds: int, visibility: int) -> LevelBatch:
        """At most `count` messages of one level; long-polls only when every level is empty."""
        order = self.policy.order()
        now = time.monotonic()
        # Levels seen empty a moment ago go last; they are polled again only if nothing else has
        # messages, and once their recheck time has passed, in their turn.
        fresh = [level for level in order if self._empty_until.get(level, 0.0) <= now]
        for level in fresh + [level for level in order if level not in fresh]:
            batch = self._poll_level(level, count, 0, visibility)
            if batch.messages:
                return batch
        return self._poll_level(order[0], count, wait_seconds, visibility)

    def _poll_level(self, level: str, count: int, wait: int, visibility: int) -> LevelBatch:
        box = self.by_level[level]
        polled_at = time.monotonic()
        messages = box.receive(count, wait, visibility)
        if messages:
            self._empty_until.pop(level, None)
        else:
            self._empty_until[level] = time.monotonic() + self.recheck_seconds
        return LevelBatch(box, messages, polled_at)
