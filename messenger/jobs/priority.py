"""Polling the levels of a prioritized channel: higher levels first, lower ones never starved.

Each poll serves one level. `PriorityPolicy` decides which: 'weighted' (default) picks levels by
smooth weighted round-robin, so that with a backlog everywhere the polls (and, full polls being
equal, the messages) follow the weights, e.g. {'high': 4, 'default': 2, 'low': 1} serves high 4 of
every 7 polls and low 1; 'strict' always serves the highest level that has messages.

The runtime that polls the levels is `messenger.consume.levels.LevelPoller`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from messenger.errors import InvalidChannelSpec

PRIORITY_MODES: tuple[str, ...] = ("weighted", "strict")


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
