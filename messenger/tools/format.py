"""Small formatting helpers the `messenger` commands and the dashboard share."""

from __future__ import annotations


def duration_text(seconds: float | None) -> str:
    """A duration with its unit, rounded to the largest that fits: '42s', '5m', '3h', '2d';
    '-' for None."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


#: EventBridge Scheduler fires a one-time schedule within a minute of its time: until then a
#: job past its due time is on its way, not late.
FIRING_WINDOW_SECONDS = 60


def due_text(seconds_left: float | None) -> str:
    """How long until a scheduled job is due: '42s', '5m', '3h' ahead (`duration_text`); 'due
    now' from its time until Scheduler's minute to fire it is over; then 'overdue 5m' (its
    target refuses the send and Scheduler retries, or the schedule is disabled); '-' for None."""
    if seconds_left is None:
        return "-"
    if seconds_left >= 1:
        return duration_text(seconds_left)
    if seconds_left > -FIRING_WINDOW_SECONDS:
        return "due now"
    return f"overdue {duration_text(-seconds_left)}"
