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
