"""Polling the levels of a prioritized channel (the policy is `messenger.jobs.priority`).

`LevelPoller` makes the SQS calls: it short-polls (WaitTimeSeconds=0) the chosen level, then the
others from the highest down, and returns the first level's messages it gets. Only when every level
came back empty does it long-poll, on the level the policy chose, so an empty level never holds up
the others for a 20 s long poll. A level found empty is skipped for `recheck_seconds` (1 s) while
another level has messages, which keeps the requests per message near one poll per batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from messenger.consume.mailbox import Mailbox
from messenger.jobs.priority import PriorityPolicy

#: Seconds an empty level is skipped while another level has messages.
RECHECK_SECONDS = 1.0


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
