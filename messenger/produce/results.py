"""`Producer.result(job_id, timeout)`: waits for a job's final outcome on a channel that keeps
results (`ChannelSpec.keep_results`), reading it back off (`messenger.jobs.results`).

The reads back off: the first after FIRST_DELAY_SECONDS, each wait twice the one before up to
MAX_DELAY_SECONDS, each drawn between half and all of its value (jitter: many producers waiting
on jobs that finish together do not read in step). A job waited on for a minute costs 22
GetItem requests on average, for an hour 966 (200 draws of the jitter each, with the clock of
the tests). The clock and the sleep are injectable (tests move a clock of their own).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

from messenger.jobs.results import ResultStore

#: Seconds before the second read (the first is at once).
FIRST_DELAY_SECONDS = 0.1
#: The longest wait between two reads.
MAX_DELAY_SECONDS = 5.0


def check_timeout(timeout: Any) -> float | None:
    """`timeout` as seconds (None: wait for ever); ValueError naming it otherwise."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be None (wait for ever) or a number of seconds >= 0, "
                         f"got {timeout!r}")
    return float(timeout)


class ResultWaits:
    """Waits for jobs' final outcomes in a `ResultStore`, backing off (module doc).

    store: the outcomes. first_delay / max_delay: the backoff (FIRST_DELAY_SECONDS,
    MAX_DELAY_SECONDS). clock: monotonic seconds (`time.monotonic`). sleep: waits that many
    seconds (`time.sleep`). draw: a number in [0, 1) for the jitter (`random.random`)."""

    def __init__(self, store: ResultStore, first_delay: float = FIRST_DELAY_SECONDS,
                 max_delay: float = MAX_DELAY_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 draw: Callable[[], float] = random.random) -> None:
        self.store = store
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.clock = clock
        self.sleep = sleep
        self.draw = draw
        #: Reads made so far (GetItem requests).
        self.reads = 0

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """The job's result once it completed; `messenger.JobFailed` when it ended otherwise;
        TimeoutError when it has no final outcome within `timeout` seconds (None: wait for
        ever; 0: one read)."""
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a job's id (a non-empty string), got {job_id!r}")
        limit = check_timeout(timeout)
        deadline = None if limit is None else self.clock() + limit
        delay = self.first_delay
        while True:
            self.reads += 1
            outcome = self.store.get(job_id)
            if outcome is not None:
                if outcome.ok:
                    return outcome.result
                raise outcome.failure()
            now = self.clock()
            if deadline is not None and now >= deadline:
                raise TimeoutError(f"job {job_id} has no final outcome after {limit:g} s")
            pause = delay * (0.5 + self.draw() / 2)
            if deadline is not None:
                pause = min(pause, deadline - now)
            self.sleep(pause)
            delay = min(self.max_delay, delay * 2)
