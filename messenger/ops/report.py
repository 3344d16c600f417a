"""Slack Block Kit messages of the ops Lambdas, and their plain-text preview.

Messages are short lines that read well on a phone: a header that says how bad it is, one line
of context, a digest (the count per category, the critical and failed ones first), then one
section per queue (alarm) or per category (cleaner), each row saying what to do next (a console
link; for a dead-letter queue its channel and the command that inspects or requeues it).
Slack allows 50 blocks per message and 3,000 characters per section: a longer report is split
into as many posts as it needs; a later post is titled with the category it holds and
"part k of n", and every post holding a critical row carries the mention. The same
`render_text` preview is kept in docs/ (UPDATE_GOLDEN=1 pytest tests/unit/test_ops_report.py)
and printed by the demo.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

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


#: One block of a report's body: (the category it belongs to, the block, holds a critical row).
Row = tuple[str, dict[str, Any], bool]


def split_posts(
    title: str, context_text: str, body: Sequence[Row], fallback: str, mention: str = "",
) -> list[dict[str, Any]]:
    """Messages of at most MAX_BLOCKS blocks and MAX_POST_CHARS characters. The first has the
    title; a later one is titled with its first row's category ('continued' when the category
    began in the post before) and 'part k of n'. Every post has the context line, and, when it
    holds a critical row, `mention` (in its text too, which notifies). No later part opens, and
    no part ends, with a divider."""
    room = MAX_BLOCKS - 3  # header, context, mention
    parts: list[list[Row]] = [[]]
    size = 0
    for row in body:
        length = len(json.dumps(row[1]))
        part = parts[-1]
        if part and (len(part) >= room or size + length > MAX_POST_CHARS - 2_000):
            parts.append([])
            part, size = parts[-1], 0
        if row[1]["type"] == "divider" and not part and len(parts) > 1:
            continue  # a later part opens with its section, right under the context line
        part.append(row)
        size += length
    messages = []
    for number, part in enumerate(parts, 1):
        while part and part[-1][1]["type"] == "divider":
            part.pop()
        of = f"part {number} of {len(parts)}"
        if number == 1:
            heading = f"{title} · {of}" if len(parts) > 1 else title
        else:
            category = part[0][0] if part else title
            before = parts[number - 2]
            continued = " (continued)" if before and category == before[-1][0] else ""
            heading = f"{category}{continued} · {of}"
        critical = mention and any(row[2] for row in part)
        blocks = [header(heading), context(context_text)]
        if critical:
            blocks.append(section(f"{mention} critical queues in this post need attention"))
        text = f"{heading}: {fallback}" if number == 1 else heading
        messages.append({"text": f"{mention} {text}" if critical else text,
                         "blocks": [*blocks, *(row[1] for row in part)]})
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


def console_link(arn: str) -> str:
    """A Slack link to the queue in the AWS console ('' without an ARN)."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[2] != "sqs":
        return ""
    _, partition, _, region, account, name = parts
    domain = "amazonaws.com.cn" if partition == "aws-cn" else "amazonaws.com"
    url = quote(f"https://sqs.{region}.{domain}/{account}/{name}", safe="")
    return (f"<https://{region}.console.aws.amazon.com/sqs/v3/home?region={region}"
            f"#/queues/{url}|console>")


# -- queue alarm -----------------------------------------------------------------------------
def queue_alarm_messages(report: QueueAlarmReport, mention: str = "") -> list[dict[str, Any]]:
    """The alarm: critical variant (🚨, critical queues first, `mention` e.g. '<!here>' or
    '<!subteam^ID>' in every post holding a critical queue) or the plain one (⚠️); a digest of
    the counts; as many posts as the queues need."""
    problems = report.problems
    kind = "dead-letter queue" if report.scope == "dlq" else "queue"
    critical = report.critical
    if critical:
        title = f"🚨 {counted(len(critical), 'critical ' + kind)} over threshold"
        if len(problems) > len(critical):
            title += f" (+{len(problems) - len(critical)} more)"
    elif not problems and not report.stopped and not report.bad_tags and (
            report.pauses_reapplied or report.pause_errors):
        title = "⏸️ A deploy had undone a pause: " + (
            "put back" if not report.pause_errors else "not all of it put back")
    elif problems or not report.stopped:
        title = f"⚠️ {counted(len(problems), kind)} over threshold"
    else:
        title = f"⛔ Queue alarm stopped early: {counted(len(report.not_checked), kind)} " \
                f"not checked"
    if report.stopped and problems:
        title += " · stopped early"
    plain = len(problems) - len(critical)
    counts = [f"*🔴 Critical: {len(critical)}*" if critical else "",
              f"🟠 Over threshold: {plain}" if plain else "",
              f"⚠️ Malformed threshold tags: {len(report.bad_tags)}" if report.bad_tags else "",
              f"⏸️ Not checked: {len(report.not_checked)}" if report.not_checked else ""]
    digest = " · ".join(filter(None, counts))
    body: list[Row] = []
    if report.stopped:
        found = f" ({len(problems)} over threshold, below)" if problems \
            else ", none over threshold"
        body.append(("⛔ Stopped early", section(
            f"⛔ *Stopped early:* {report.stopped}. {counted(report.checked, kind)} checked"
            f"{found}; {len(report.not_checked)} not (listed last)."), False))
    if digest.count(" · "):  # more than one kind of row
        body.append(("Digest", section(f"*Digest:* {digest}"), False))
    for index, problem in enumerate(problems):
        category = "🔴 Critical" if problem.critical else "🟠 Over threshold"
        if index and problem.critical != problems[index - 1].critical:
            body.append((category, divider(), False))
        text = _problem_text(problem, report.scope, report.namespace)
        body.append((category, section(text), problem.critical))
    if report.bad_tags:
        body.append(("⚠️ Malformed threshold tags", divider(), False))
        lines = [f"• `{queue}`: {tag}=`{value}` is not a whole number ≥ 0; threshold "
                 f"{threshold:,} applied (fix the tag)"
                 for queue, tag, value, threshold in report.bad_tags]
        body.append(("⚠️ Malformed threshold tags", section(
            f"*⚠️ Malformed threshold tags ({len(lines)})*\n" + "\n".join(lines)), False))
    if report.pauses_reapplied or report.pause_errors:
        name = "⏸️ Pauses put back after a deploy"
        body.append((name, divider(), False))
        lines = [f"• {line}" for line in report.pauses_reapplied] + [
            f"• ⛔ not put back: {line}" for line in report.pause_errors]
        body.append((name, section(
            f"*{name} ({len(lines)})*: the channel stays paused until an operator resumes it "
            f"(`messenger resume <channel>`)\n" + "\n".join(lines)), False))
    if report.not_checked:
        name = "⏸️ Not checked: the run stopped first"
        body.append((name, divider(), False))
        body.extend((name, block, False) for block in _category(
            name, [Finding(queue, "depth not read") for queue in report.not_checked]))
    fallback = ", ".join(p.name for p in problems[:10]) + ("…" if len(problems) > 10 else "")
    if not fallback and report.pauses_reapplied:
        fallback = "pause put back: " + "; ".join(report.pauses_reapplied[:3])
    if report.stopped:
        fallback = f"stopped early: {report.stopped}; {fallback or 'nothing over threshold'}"
    return split_posts(
        title,
        f"{SCOPE_TITLES[report.scope]} · {where(report.namespace)} · "
        f"{report.checked} checked · {when(report.checked_at)}",
        body, fallback or digest, mention=mention,
    )


def queue_alarm_message(report: QueueAlarmReport, mention: str = "") -> dict[str, Any]:
    """The first (usually the only) post of the alarm."""
    return queue_alarm_messages(report, mention)[0]


def _problem_text(problem: QueueProblem, scope: str, namespace: str) -> str:
    mark = "🔴" if problem.critical else "🟠"
    label = " · critical" if problem.critical else ""
    link = console_link(problem.arn)
    lines = [
        f"{mark} *{problem.name}*{label}" + (f" · {link}" if link else ""),
        f"Depth *{problem.depth:,}* / threshold {problem.threshold:,} · "
        f"oldest {duration(problem.oldest_age_seconds)}",
    ]
    who = owner_label(problem.team, problem.owner)
    if who:
        lines.append(who)
    if problem.paused:  # its consumers do not receive: the depth grows on purpose
        lines.append(f"⏸ Channel `{problem.channel}` {problem.paused} "
                     f"(resume: `{cli_command(f'resume {problem.channel}', namespace)}`)")
    if scope == "dlq":
        ordered = " --ordered" if problem.name.endswith(".fifo") else ""
        inspect = cli_command(f"dlq list {problem.channel}", namespace)
        command = cli_command(f"requeue {problem.name} {problem.channel}{ordered}", namespace)
        lines.append(f"Channel `{problem.channel}` · inspect: `{inspect}` · "
                     f"requeue all: `{command}`")
    return "\n".join(lines)


def cli_command(arguments: str, namespace: str) -> str:
    """A `messenger` command line that works as pasted: the report's namespace set the way the
    command reads it (MESSENGER_NAMESPACE), since a channel's name resolves within one."""
    prefix = f"MESSENGER_NAMESPACE={namespace} " if namespace else ""
    return f"{prefix}messenger {arguments}"


# -- resource cleaner ------------------------------------------------------------------------
def cleaner_messages(report: CleanerReport, outcome_only: bool = False) -> list[dict[str, Any]]:
    """The clean-up report: a digest, then one section per non-empty category, the run's
    problems first (could not clean, stopped early), split into as many posts as needed.
    A plan (`report.planned`) lists what is about to be deleted; `outcome_only`: only what
    the deletions did (posted after a plan that listed the rest)."""
    if report.planned:
        gone = "to delete now"
    else:
        gone = "would be deleted (dry run)" if report.dry_run else "deleted"
    categories: list[tuple[str, Sequence[Finding]]] = [
        ("❗ Could not clean", report.failed),
        ("⏸️ Not checked: the run stopped first", report.not_checked),
        ("✋ Unused, not deleted: the run stopped first", report.not_deleted),
        (f"🗑️ Unused topics {gone}", report.deleted_topics),
        (f"🗑️ Unused queues {gone}", report.deleted_queues),
    ]
    if not outcome_only:
        categories += [
            ("⏳ Queues with stale messages", report.stale),
            ("🚫 Queues without producers", report.no_producers),
            ("📭 Queues without consumers", report.no_consumers),
            ("🔒 Unused, kept: a CloudFormation stack owns them", report.kept_by_stack),
            ("🔒 Unused, kept: named outside the namespace's prefix",
             report.kept_outside_prefix),
            ("💤 Inactive topics kept: a queue that stays is subscribed", report.kept_topics),
        ]
    title = "🧹 Resource cleaner" + (" · dry run" if report.dry_run else "")
    if report.planned:
        planned = [counted(len(found), noun) for found, noun in (
            (report.deleted_queues, "queue"), (report.deleted_topics, "topic")) if found]
        title += f" · deleting now: {', '.join(planned)}"
    elif outcome_only:
        title += " · deletions done"
    if report.stopped:
        title += " · stopped early"
    body: list[Row] = []
    if report.stopped:
        done = "would be deleted" if report.dry_run else "were deleted"
        body.append(("⛔ Stopped early", section(
            f"⛔ *Stopped early:* {report.stopped}. Only the resources listed as deleted "
            f"{done}; what is listed as not checked or not deleted is still there."), True))
    digest = " · ".join(f"{_SHORT.get(n, n.split(' ', 1)[1])}: {len(f)}"
                        for n, f in categories if f)
    if digest:
        body.append(("Digest", section(f"*Digest:* {digest}"), False))
    for name, findings in categories:
        if findings:
            body.append((name, divider(), False))
            failing = name.startswith(("❗", "⏸️", "✋"))
            body.extend((name, block, failing) for block in _category(name, findings))
    total = report.topics_checked + report.queues_checked
    judged = (f"{total - len(report.not_checked)} of {total} topics and queues judged"
              if report.not_checked else
              f"{report.topics_checked} topics and {report.queues_checked} queues checked")
    return split_posts(
        title, f"{where(report.namespace)} · {judged} · {when(report.checked_at)}",
        body, digest or "nothing to report",
    )


#: A category's name in the digest, when its title is long.
_SHORT = {
    "⏸️ Not checked: the run stopped first": "Not checked",
    "✋ Unused, not deleted: the run stopped first": "Not deleted",
    "🔒 Unused, kept: a CloudFormation stack owns them": "Kept by a stack",
    "🔒 Unused, kept: named outside the namespace's prefix": "Kept: outside the prefix",
    "💤 Inactive topics kept: a queue that stays is subscribed": "Inactive topics kept",
}


def cleaner_message(report: CleanerReport, outcome_only: bool = False) -> dict[str, Any]:
    """The first (usually the only) post of the clean-up report."""
    return cleaner_messages(report, outcome_only)[0]


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
