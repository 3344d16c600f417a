"""ECS task scale-in protection while the consumer processes messages.

Step scaling on queue depth scales in while a task is mid-message (its messages are in flight,
not visible), and ECS would stop that task: a long job killed and redone. A consumer on ECS takes
task scale-in protection through the ECS agent (`PUT $ECS_AGENT_URI/task-protection/v1/state`,
`{"ProtectionEnabled": true, "ExpiresInMinutes": N}`) when it goes from idle to busy, renews it
while busy, and drops it when idle again; ECS then scales in only idle tasks. The expiry lies
beyond the processing timeout, so a consumer that dies while protected is not protected for long.

Outside ECS (no `ECS_AGENT_URI`) it does nothing. Calls run on a background thread, never in the
message path; a failing agent is logged, never fatal (at worst a task is scaled in, and its
in-flight messages come back after their visibility timeout, as without protection). The task
role needs `ecs:UpdateTaskProtection` on its own cluster's tasks (`ConsumerService` grants it).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

from messenger.consume.lifecycle import ConsumerState

logger = logging.getLogger("messenger.protection")

AGENT_URI_VARIABLE = "ECS_AGENT_URI"
PROTECTION_PATH = "/task-protection/v1/state"
#: ECS accepts 1 to 2,880 minutes (48 hours).
MIN_EXPIRY_MINUTES, MAX_EXPIRY_MINUTES = 1, 2880
#: Minutes the protection outlives the longest a message may take.
EXPIRY_MARGIN_MINUTES = 5
#: Seconds one call to the agent (on the task's own host) may take.
AGENT_TIMEOUT = 2.0


def expiry_minutes(processing_timeout: float) -> int:
    """The protection's lifetime: the processing timeout in whole minutes, plus the margin."""
    minutes = math.ceil(processing_timeout / 60) + EXPIRY_MARGIN_MINUTES
    return max(MIN_EXPIRY_MINUTES, min(MAX_EXPIRY_MINUTES, minutes))


class TaskProtection:
    """Follows the consumer's state: protected while PROCESSING, unprotected otherwise.

    agent_uri: `$ECS_AGENT_URI` (None: not on ECS, every call is a no-op).
    expires_in_minutes: the expiry requested each time (1-2880).
    renew_every: seconds between renewals while busy (default: half the expiry).
    """

    def __init__(
        self, agent_uri: str | None, expires_in_minutes: int, renew_every: float | None = None
    ) -> None:
        if not MIN_EXPIRY_MINUTES <= expires_in_minutes <= MAX_EXPIRY_MINUTES:
            raise ValueError(
                f"expires_in_minutes must be from {MIN_EXPIRY_MINUTES} to {MAX_EXPIRY_MINUTES}, "
                f"got {expires_in_minutes}"
            )
        self.url = agent_uri.rstrip("/") + PROTECTION_PATH if agent_uri else None
        self.expires_in_minutes = expires_in_minutes
        self.renew_every = renew_every if renew_every is not None else expires_in_minutes * 30.0
        self._cond = threading.Condition()
        self._wanted = False
        self._sent: bool | None = None  # what the agent last accepted (None: nothing yet)
        self._renew_at = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str], processing_timeout: float) -> TaskProtection:
        """On ECS when `ECS_AGENT_URI` is set; the expiry is beyond `processing_timeout`."""
        return cls(environ.get(AGENT_URI_VARIABLE) or None, expiry_minutes(processing_timeout))

    @property
    def enabled(self) -> bool:
        return self.url is not None

    def follow(self, state: ConsumerState) -> None:
        """Called on every state change: protect while PROCESSING; EXITED ends it."""
        if state is ConsumerState.EXITED:
            self.close()
        else:
            self.want(state is ConsumerState.PROCESSING)

    def want(self, protected: bool) -> None:
        """Ask for protection (busy) or its end (idle); returns at once."""
        if not self.enabled:
            return
        with self._cond:
            if self._closed:
                return
            self._wanted = protected
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="messenger-task-protection", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def close(self, timeout: float = AGENT_TIMEOUT + 1) -> None:
        """Drop the protection if held (waits at most `timeout`) and stop the thread."""
        with self._cond:
            self._closed = True
            self._wanted = False
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    # -- the background thread ----------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._wanted != self._sent and (self._wanted or self._sent):
                        break  # a change to send (never an initial "unprotected")
                    if self._closed:
                        return
                    if self._sent and time.monotonic() >= self._renew_at:
                        break  # renew while busy
                    wait = self._renew_at - time.monotonic() if self._sent else None
                    self._cond.wait(wait)
                wanted = self._wanted
            accepted = self._put(wanted)
            with self._cond:
                if accepted:
                    self._sent = wanted
                    self._renew_at = time.monotonic() + self.renew_every
                elif self._closed:
                    return  # the process is ending: never retry past close()
                else:
                    # Retry on the renewal schedule (a second at least), not in a tight loop.
                    self._cond.wait(max(1.0, min(self.renew_every, 30.0)))

    def _put(self, protected: bool) -> bool:
        assert self.url is not None
        body: dict[str, object] = {"ProtectionEnabled": protected}
        if protected:
            body["ExpiresInMinutes"] = self.expires_in_minutes
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), method="PUT",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=AGENT_TIMEOUT) as response:  # noqa: S310
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            logger.warning("task protection %s: the ECS agent answered %s: %s",
                           "on" if protected else "off", error.code,
                           error.read()[:300].decode("utf-8", "replace"))
            return False
        except (OSError, ValueError) as error:
            logger.warning("task protection %s: the ECS agent is unreachable: %s",
                           "on" if protected else "off", error)
            return False
        failure = answer.get("failure") or answer.get("error")
        if failure:
            logger.warning("task protection %s refused: %s", "on" if protected else "off",
                           failure)
            return False
        logger.info("task protection %s (expires %s)", "on" if protected else "off",
                    answer.get("protection", {}).get("ExpirationDate"))
        return True
