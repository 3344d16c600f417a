"""A consumer module that raises on import (its settings are wrong), and a class whose
concurrency is wrong: `messenger consume` must say so in one line."""

from __future__ import annotations

import os

from messenger import Consumer, ReceivedMessage


class ZeroConcurrency(Consumer):
    channel = "consumer_test"
    concurrency = 0

    def handler(self, message: ReceivedMessage) -> None:
        pass


if os.environ.get("BROKEN_CONSUMER_RAISES"):
    raise RuntimeError("DATABASE_URL is not set")
