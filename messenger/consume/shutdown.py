"""The consumer runtime's graceful shutdown (`ShuttingDown`, a part of
`messenger.consume.runtime.Runtime`): no new message starts, messages waiting for a worker go
back at once, in-flight work finishes up to the shutdown timeout, what is left is released, the
pending deletes go out, and the threads stop (the lease keeper last), all within the shutdown
timeout (at least WIND_DOWN_SECONDS for the last calls)."""

from __future__ import annotations

import threading
import time

from messenger.consume.mailbox import Delivery, Stage
from messenger.consume.parts import RuntimeParts

#: The last calls of a shutdown (releases, pending deletes) get at least this long, even when
#: in-flight handlers used up the shutdown timeout.
WIND_DOWN_SECONDS = 1.0


class ShuttingDown(RuntimeParts):
    """The runtime's shutdown (module doc)."""

    def shutdown(self) -> None:
        """No new message starts; in-flight work finishes up to the shutdown timeout; what is
        left is released; pending deletes go out. The whole takes at most the shutdown timeout
        (at least WIND_DOWN_SECONDS for the last calls): against an endpoint that does not
        answer, the last calls are left behind (`shutdown_incomplete`; their messages come
        back when their leases end) rather than outliving ECS's stop timeout."""
        self.stop()
        self.refresh_state()
        deadline = time.monotonic() + self.config.shutdown_timeout
        # Messages waiting for a worker go back at once, not once a busy worker frees up.
        waiting = [d for chain in self._work.drain() for d in chain
                   if d.claim(Stage.QUEUED, Stage.DONE)]
        if waiting:
            threading.Thread(
                target=self._guarded(lambda: self._release(waiting, reason="shutdown")),
                name="messenger-release", daemon=True).start()
        with self._cond:
            # Held: queued, running, or being dead-lettered by the watchdog.
            while self._held and time.monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            left = [d for d in self._held.values() if d.stage in (Stage.QUEUED, Stage.RUNNING)]
        # Claim from the stage seen: a handler that finished meanwhile keeps its delete.
        abandoned = [d for d in left
                     if d.claim(Stage.QUEUED, Stage.DONE) or d.claim(Stage.RUNNING, Stage.DONE)]
        finish = threading.Thread(target=self._guarded(lambda: self._wind_down(abandoned)),
                                  name="messenger-shutdown", daemon=True)
        finish.start()
        finish.join(max(WIND_DOWN_SECONDS, deadline - time.monotonic()))
        if finish.is_alive():
            self.consumer.emit("shutdown_incomplete", fields={
                "unconfirmed_deletes": len(self._deleting), "abandoned": len(abandoned),
                "shutdown_timeout": self.config.shutdown_timeout,
            })

    def _wind_down(self, abandoned: list[Delivery]) -> None:
        """Release what was not finished, send the pending deletes, stop the threads (leases
        last: a message stays leased until its delete went out)."""
        if abandoned:
            self._release(abandoned, reason="shutdown_timeout")
        self._work.close()
        self.deleter.close()
        self.watchdog.stop()
        if self.controls is not None:
            self.controls.stop()
        self.leases.stop()
        self.watchdog.report_lease_events()
