"""Slack Block Kit messages of the ops Lambdas, and their plain-text preview.

Messages are short lines that read well on a phone: a header that says how bad it is, one line
of context, then one section per queue (alarm) or per category (cleaner). Slack allows 50 blocks
and 3,000 characters per section; longer lists end with "... and N more".
The same `render_text` preview is kept in docs/ and printed by the demo.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from messenger.ops.findings import CleanerReport, Finding, QueueAlarmReport, QueueProblem

MAX_BLOCKS = 50
MAX_SECTION_CHARS = 3000
#: Queues listed one by one in an alarm before "... and N more".
MAX_ALARM_QUEUES = 30
SCOPE_TITLES = {"source": "Source queues", "dlq": "Dead-letter queues"}


class Notifier(Protocol):
    """Where reports go (the Slack webhook in the Lambdas)."""

    def prepare(self) -> None:
        """Raise now if posting cannot work (e.g. the webhook secret is missing)."""

    def post(self, message: dict[str, Any]) -> bool:
        """Post a Block Kit message; False when it could not be delivered (already logged)."""


# -- building blocks -------------------------------------------------------------------------
def header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": text[:150], "emoji": True}}


def context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}]}


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:MAX_SECTION_CHARS]}}


def divider() -> dict[str, Any]:
    return {"type": "divider"}


def when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def duration(seconds: float | None) -> str:
    """'45 s', '12 min', '3 h 5 min', '2 d 4 h'; 'unknown' for None."""
    if seconds is None:
        return "unknown"
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def where(namespace: str) -> str:
    return f"namespace `{namespace}`" if namespace else "no namespace"


# -- queue alarm -----------------------------------------------------------------------------
def queue_alarm_message(report: QueueAlarmReport) -> dict[str, Any]:
    """The alarm: critical variant (🚨, critical queues first) or the plain one (⚠️)."""
    problems = report.problems
    kind = "dead-letter queue" if report.scope == "dlq" else "queue"
    count = len(problems)
    plural = "s" if count != 1 else ""
    critical = report.critical
    if critical:
        many = "s" if len(critical) != 1 else ""
        title = f"🚨 {len(critical)} critical {kind}{many} over threshold"
        if count > len(critical):
            title += f" (+{count - len(critical)} more)"
    else:
        title = f"⚠️ {count} {kind}{plural} over threshold"
    blocks = [
        header(title),
        context(
            f"{SCOPE_TITLES[report.scope]} · {where(report.namespace)} · "
            f"{report.checked} checked · {when(report.checked_at)}"
        ),
    ]
    shown = problems[:MAX_ALARM_QUEUES]
    for index, problem in enumerate(shown):
        if index and problem.critical != shown[index - 1].critical:
            blocks.append(divider())
        blocks.append(section(_problem_text(problem)))
    if count > len(shown):
        blocks.append(context(f"… and {count - len(shown)} more {kind}s over threshold"))
    fallback = f"{title}: " + ", ".join(p.name for p in problems[:10])
    return {"text": fallback, "blocks": blocks}


def _problem_text(problem: QueueProblem) -> str:
    mark = "🔴" if problem.critical else "🟠"
    label = " · critical" if problem.critical else ""
    lines = [
        f"{mark} *{problem.name}*{label}",
        f"Depth *{problem.depth:,}* / threshold {problem.threshold:,} · "
        f"oldest {duration(problem.oldest_age_seconds)}",
    ]
    who = " · ".join(x for x in (problem.team and f"team {problem.team}",
                                 problem.owner and f"owner {problem.owner}") if x)
    if who:
        lines.append(who)
    return "\n".join(lines)


# -- resource cleaner ------------------------------------------------------------------------
def cleaner_message(report: CleanerReport) -> dict[str, Any]:
    """The daily clean-up report: one section per non-empty category."""
    gone = "would be deleted (dry run)" if report.dry_run else "deleted"
    categories: list[tuple[str, Sequence[Finding]]] = [
        (f"🗑️ Unused topics {gone}", report.deleted_topics),
        (f"🗑️ Unused queues {gone}", report.deleted_queues),
        ("⏳ Queues with stale messages", report.stale),
        ("🚫 Queues without producers", report.no_producers),
        ("📭 Queues without consumers", report.no_consumers),
        ("🔒 Unused, kept: a CloudFormation stack owns them", report.kept_by_stack),
        ("❗ Could not clean", report.failed),
    ]
    title = "🧹 Resource cleaner" + (" · dry run" if report.dry_run else "")
    blocks = [
        header(title),
        context(
            f"{where(report.namespace)} · {report.topics_checked} topics and "
            f"{report.queues_checked} queues checked · {when(report.checked_at)}"
        ),
    ]
    for name, findings in categories:
        if findings:
            blocks.append(divider())
            blocks.extend(_category(name, findings))
    if len(blocks) > MAX_BLOCKS:
        blocks = blocks[: MAX_BLOCKS - 1] + [context("… report cut to Slack's 50 blocks")]
    counts = ", ".join(f"{len(f)} {n.split(' ', 1)[1].lower()}" for n, f in categories if f)
    return {"text": f"{title}: {counts or 'nothing to report'}", "blocks": blocks}


def _category(name: str, findings: Sequence[Finding]) -> Iterable[dict[str, Any]]:
    """A bold title with the count, then bullets, split into sections under 3,000 chars."""
    text = f"*{name} ({len(findings)})*"
    for finding in findings:
        stack = f" · stack `{finding.stack}`" if finding.stack else ""
        bullet = f"\n• `{finding.name}`{stack}\n   {finding.detail}"
        if len(text) + len(bullet) > MAX_SECTION_CHARS - 100:
            yield section(text)
            text = ""
        text += bullet
    yield section(text.lstrip("\n"))


# -- preview ---------------------------------------------------------------------------------
def render_text(message: dict[str, Any], width: int = 60) -> str:
    """A plain-text preview of a Block Kit message, as Slack lays it out (mrkdwn kept as is)."""
    lines: list[str] = []
    for block in message.get("blocks", []):
        kind = block.get("type")
        if kind == "header":
            lines += [block["text"]["text"], "=" * width]
        elif kind == "context":
            lines += [" ".join(e.get("text", "") for e in block.get("elements", []))]
        elif kind == "section":
            lines += ["", *block["text"]["text"].splitlines()]
        elif kind == "divider":
            lines += ["", "-" * width]
    return "\n".join(lines).rstrip() + "\n"
