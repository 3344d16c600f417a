"""Slack Block Kit messages of the ops Lambdas, and their plain-text preview.

Messages are short lines that read well on a phone: a header that says how bad it is, one line
of context, then one section per queue (alarm) or per category (cleaner). Slack allows 50 blocks
per message and 3,000 characters per section: a longer report is split into as many posts as it
needs, numbered in their headers ("(2/3)"), so that every queue is named in some post.
The same `render_text` preview is kept in docs/ and printed by the demo.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from messenger.errors import MessengerError
from messenger.ops.findings import CleanerReport, Finding, QueueAlarmReport, QueueProblem


class ReportNotDelivered(MessengerError):
    """A report could not be posted to Slack (it is in the log); the invocation fails."""

MAX_BLOCKS = 50
MAX_SECTION_CHARS = 3000
#: Characters of one post's JSON, well under what a webhook accepts.
MAX_POST_CHARS = 30_000
SCOPE_TITLES = {"source": "Source queues", "dlq": "Dead-letter queues"}


class Notifier(Protocol):
    """Where reports go (the Slack webhook in the Lambdas)."""

    def prepare(self) -> None:
        """Raise now if posting cannot work (e.g. the webhook secret is missing)."""

    def post(self, message: dict[str, Any]) -> bool:
        """Post a Block Kit message; False when it could not be delivered (already logged)."""


#: A post is not started with less than this left: the notifier's reserve (to log the report
#: and flush the metrics) plus one short attempt. The notifier keeps each post's retries and
#: attempts within the time left (messenger.ops.slack).
POST_BUDGET_SECONDS = 6.0


def short_of_time(remaining: Callable[[], float] | None, margin: float) -> str | None:
    """Why to stop when the invocation has less than `margin` seconds left (`remaining`: the
    seconds it has left, None: no limit); else None."""
    if remaining is not None and remaining() < margin:
        return f"less than {margin:g} s of the Lambda's time left"
    return None


def counted(number: float, noun: str) -> str:
    """'1 message', '1,200 messages' (the noun's plural: an 's')."""
    return f"{number:,.0f} {noun}{'' if number == 1 else 's'}"


def owner_label(team: str, owner: str) -> str:
    """'team t · owner o' from a resource's tags ('' when it has neither)."""
    return " · ".join(x for x in (team and f"team {team}", owner and f"owner {owner}") if x)


def post_all(
    notifier: Notifier, messages: Sequence[dict[str, Any]],
    remaining: Callable[[], float] | None = None, log: Any = None,
) -> bool:
    """Post every part of a report, while the invocation has more than POST_BUDGET_SECONDS
    left; True when every one was delivered. A part not posted is logged whole (the notifier
    logs the parts it failed to deliver). remaining: seconds the invocation has left."""
    delivered = []
    for number, message in enumerate(messages, 1):
        if short_of_time(remaining, POST_BUDGET_SECONDS):
            (log or logging.getLogger(__name__)).error(
                "report parts not posted: the Lambda's time is running out",
                extra={"parts": f"{number}-{len(messages)} of {len(messages)}",
                       "undelivered": json.dumps(messages[number - 1:], ensure_ascii=False)})
            return False
        delivered.append(notifier.post(message))
    return all(delivered)


def split_posts(
    title: str, context_text: str, body: Sequence[dict[str, Any]], fallback: str
) -> list[dict[str, Any]]:
    """Messages of at most MAX_BLOCKS blocks and MAX_POST_CHARS characters, each with the header
    (numbered when there are several) and the context line; no later part opens, and no part
    ends, with a divider."""
    room = MAX_BLOCKS - 2
    parts: list[list[dict[str, Any]]] = [[]]
    size = 0
    for block in body:
        length = len(json.dumps(block))
        part = parts[-1]
        if part and (len(part) >= room or size + length > MAX_POST_CHARS - 2_000):
            parts.append([])
            part, size = parts[-1], 0
        if block["type"] == "divider" and not part and len(parts) > 1:
            continue  # a later part opens with its section, right under the context line
        part.append(block)
        size += length
    messages = []
    for number, part in enumerate(parts, 1):
        while part and part[-1]["type"] == "divider":
            part.pop()
        numbered = f"{title} ({number}/{len(parts)})" if len(parts) > 1 else title
        messages.append({"text": f"{numbered}: {fallback}" if number == 1 else numbered,
                         "blocks": [header(numbered), context(context_text), *part]})
    return messages


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
def queue_alarm_messages(report: QueueAlarmReport, mention: str = "") -> list[dict[str, Any]]:
    """The alarm: critical variant (🚨, critical queues first, `mention` e.g. '<!here>' or
    '<!subteam^ID>' pinged) or the plain one (⚠️); as many posts as the queues need."""
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
    elif problems or not report.stopped:
        title = f"⚠️ {count} {kind}{plural} over threshold"
    else:
        title = f"⛔ Queue alarm stopped early: {len(report.not_checked)} {kind}s not checked"
    if report.stopped and problems:
        title += " · stopped early"
    body: list[dict[str, Any]] = []
    if critical and mention:
        body.append(section(f"{mention} critical queues need attention"))
    if report.stopped:
        body.append(section(
            f"⛔ *Stopped early:* {report.stopped}. {report.checked} {kind}s were checked"
            f"{f' ({count} over threshold, below)' if problems else ', none over threshold'}; "
            f"{len(report.not_checked)} were not (listed last)."))
    for index, problem in enumerate(problems):
        if index and problem.critical != problems[index - 1].critical:
            body.append(divider())
        body.append(section(_problem_text(problem)))
    if report.not_checked:
        body.append(divider())
        body.extend(_category(
            "⏸️ Not checked: the run stopped first",
            [Finding(name, "depth not read") for name in report.not_checked]))
    fallback = ", ".join(p.name for p in problems[:10]) + ("…" if count > 10 else "")
    if report.stopped:
        fallback = f"stopped early: {report.stopped}; {fallback or 'nothing over threshold'}"
    if critical and mention:
        fallback = f"{mention} {fallback}"
    return split_posts(
        title,
        f"{SCOPE_TITLES[report.scope]} · {where(report.namespace)} · "
        f"{report.checked} checked · {when(report.checked_at)}",
        body, fallback,
    )


def queue_alarm_message(report: QueueAlarmReport, mention: str = "") -> dict[str, Any]:
    """The first (usually the only) post of the alarm."""
    return queue_alarm_messages(report, mention)[0]


def _problem_text(problem: QueueProblem) -> str:
    mark = "🔴" if problem.critical else "🟠"
    label = " · critical" if problem.critical else ""
    lines = [
        f"{mark} *{problem.name}*{label}",
        f"Depth *{problem.depth:,}* / threshold {problem.threshold:,} · "
        f"oldest {duration(problem.oldest_age_seconds)}",
    ]
    who = owner_label(problem.team, problem.owner)
    if who:
        lines.append(who)
    return "\n".join(lines)


# -- resource cleaner ------------------------------------------------------------------------
def cleaner_messages(report: CleanerReport) -> list[dict[str, Any]]:
    """The daily clean-up report: one section per non-empty category, the run's problems first
    (stopped early, could not clean), split into as many posts as needed."""
    gone = "would be deleted (dry run)" if report.dry_run else "deleted"
    categories: list[tuple[str, Sequence[Finding]]] = [
        ("❗ Could not clean", report.failed),
        ("⏸️ Not checked: the run stopped first", report.not_checked),
        (f"🗑️ Unused topics {gone}", report.deleted_topics),
        (f"🗑️ Unused queues {gone}", report.deleted_queues),
        ("⏳ Queues with stale messages", report.stale),
        ("🚫 Queues without producers", report.no_producers),
        ("📭 Queues without consumers", report.no_consumers),
        ("🔒 Unused, kept: a CloudFormation stack owns them", report.kept_by_stack),
        ("🔒 Unused, kept: named outside the namespace's prefix", report.kept_outside_prefix),
        ("💤 Inactive topics kept: a queue that stays is subscribed", report.kept_topics),
    ]
    title = "🧹 Resource cleaner" + (" · dry run" if report.dry_run else "")
    if report.stopped:
        title += " · stopped early"
    body: list[dict[str, Any]] = []
    if report.stopped:
        body.append(section(f"⛔ *Stopped early:* {report.stopped}. Everything listed below "
                            f"was done; nothing else was deleted."))
    for name, findings in categories:
        if findings:
            body.append(divider())
            body.extend(_category(name, findings))
    counts = ", ".join(f"{len(f)} {n.split(' ', 1)[1].lower()}" for n, f in categories if f)
    return split_posts(
        title,
        f"{where(report.namespace)} · {report.topics_checked} topics and "
        f"{report.queues_checked} queues checked · {when(report.checked_at)}",
        body, counts or "nothing to report",
    )


def cleaner_message(report: CleanerReport) -> dict[str, Any]:
    """The first (usually the only) post of the clean-up report."""
    return cleaner_messages(report)[0]


def _category(name: str, findings: Sequence[Finding]) -> Iterable[dict[str, Any]]:
    """A bold title with the count, then bullets, split into sections under 3,000 chars."""
    text = f"*{name} ({len(findings)})*"
    by_owner = any(f.owner for f in findings)
    current_owner: str | None = None
    for finding in sorted(findings, key=lambda f: f.owner) if by_owner else findings:
        stack = f" · stack `{finding.stack}`" if finding.stack else ""
        bullet = f"\n• `{finding.name}`{stack}\n   {finding.detail}"
        if by_owner and finding.owner != current_owner:
            current_owner = finding.owner
            bullet = f"\n_{finding.owner or 'no owner tag'}_" + bullet
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
