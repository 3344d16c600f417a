"""The consumer runtime's work queue (`WorkQueue`): chains of received messages (a message; a
group's messages on an ordered channel) waiting for a worker (`messenger.consume.workers`),
put there by the receiver (`messenger.consume.receiving`), drained at shutdown."""

from __future__ import annotations

import threading
from collections import deque

from messenger.consume.mailbox import Delivery


class WorkQueue:
    """Chains of received messages waiting for a worker.

    `put` wakes idle workers (one per chain, or none when the receiver runs them itself); a
    worker that finishes a chain takes the next one without waiting. `overdue` takes out the
    chains that waited too long while no worker was idle (`prefetch_wait`), `drain` all of them
    (shutdown)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # idle workers wait here
        self._chains: deque[list[Delivery]] = deque()
        self._closed = False
        self._idle = 0  # workers waiting in `take`

    def put(self, chains: list[list[Delivery]], wake: int = 1) -> None:
        """Queue the chains and wake up to `wake` idle workers."""
        if not chains:
            return
        with self._lock:
            self._chains.extend(chains)
            if wake:
                self._ready.notify(wake)

    def wake_waiting(self) -> None:
        """Wake an idle worker for each chain waiting."""
        with self._ready:
            self._ready.notify(len(self._chains))

    def take(self, block: bool = True) -> list[Delivery] | None:
        """The next chain; None once closed and empty (the worker exits), or when empty and
        not `block`."""
        with self._lock:
            while not self._chains:
                if self._closed or not block:
                    return None
                self._idle += 1
                try:
                    self._ready.wait()
                finally:
                    self._idle -= 1
            return self._chains.popleft()

    def overdue(self, cutoff: float) -> tuple[list[list[Delivery]], float | None]:
        """Take out the chains received at `cutoff` or before; and when the oldest chain left
        was received (None: none waits, or a worker is idle). While a worker is idle (woken, or
        left for the receiver to run them) no chain waits behind busy workers: none is taken."""
        with self._lock:
            chains = self._chains
            if self._idle:
                return [], None
            taken: list[list[Delivery]] = []
            while chains and chains[0][0].received_at <= cutoff:
                taken.append(chains.popleft())
            return taken, chains[0][0].received_at if chains else None

    def drain(self) -> list[list[Delivery]]:
        """Take out every chain waiting."""
        with self._lock:
            taken = list(self._chains)
            self._chains.clear()
            return taken

    def close(self) -> None:
        """Wake every worker: each exits once the queue is empty."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
