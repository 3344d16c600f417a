"""Slack reports: golden text previews in docs/, Slack's limits, the two alarm variants.

After an intended change: UPDATE_GOLDEN=1 pytest tests/unit/test_ops_report.py
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from messenger.ops.findings import CleanerReport, Finding, QueueAlarmReport, QueueProblem
from messenger.ops.report import (
    MAX_BLOCKS,
    MAX_POST_CHARS,
    MAX_SECTION_CHARS,
    cleaner_message,
    cleaner_messages,
    duration,
    queue_alarm_message,
    queue_alarm_messages,
    render_text,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
AT = datetime(2026, 11, 21, 9, 15, tzinfo=UTC)


def arn(name: str) -> str:
    return f"arn:aws:sqs:eu-west-1:123456789012:{name}"


def critical_alarm() -> QueueAlarmReport:
    return QueueAlarmReport("source", "prod", AT, 212, (
        QueueProblem("prod-payments", "payments", 1840, 500, 7500, True, "ana", "payments",
                     arn("prod-payments")),
        QueueProblem("prod-checkout.fifo", "cart.checkout", 260, 200, 95, True, "", "checkout",
                     arn("prod-checkout.fifo")),
        QueueProblem("prod-orders", "orders", 4210, 1000, 3 * 86400 + 3600, False, "", "shop",
                     arn("prod-orders")),
        QueueProblem("prod-emails", "emails", 130, 100, None, False, arn=arn("prod-emails")),
    ), bad_tags=(("prod-emails", "messenger:alarm-threshold", "1e3", 100),))


def plain_alarm() -> QueueAlarmReport:
    return QueueAlarmReport("dlq", "prod", AT, 212, (
        QueueProblem("prod-orders-dlq", "orders", 37, 0, 2 * 86400 + 4 * 3600, False, "", "shop",
                     arn("prod-orders-dlq")),
        QueueProblem("prod-emails-dlq", "emails", 3, 0, 5 * 3600 + 60, False, "bo",
                     arn=arn("prod-emails-dlq")),
    ))


def cleaner_report() -> CleanerReport:
    return CleanerReport(
        namespace="prod", dry_run=False, checked_at=AT, topics_checked=14, queues_checked=120,
        deleted_topics=(Finding("prod-promo_2025", "nothing published or delivered in 1 day"),),
        deleted_queues=(
            Finding("prod-promo_mailer", "empty; no sends or receives in 3 days "
                    "(no CloudWatch data); DLQ prod-promo_mailer-dlq deleted too"),
            Finding("prod-legacy_sync", "empty; no sends or receives in 3 days; "
                    "DLQ prod-legacy_sync-dlq deleted too"),
        ),
        stale=(Finding("prod-audit_export", "12 messages; no sends or receives in 3 days"),),
        no_producers=(Finding("prod-price_watch", "nothing sent in 3 days; consumers still "
                              "polling (25,920 receives)"),),
        no_consumers=(Finding("prod-invoices", "340 messages sent, none received in 3 days"),),
        kept_by_stack=(Finding("prod-reports", "empty; no sends or receives in 3 days",
                               "shop-prod"),),
    )


GOLDEN = {
    "queue_alarm_critical.txt": lambda: queue_alarm_message(critical_alarm()),
    "queue_alarm.txt": lambda: queue_alarm_message(plain_alarm()),
    "resource_cleaner.txt": lambda: cleaner_message(cleaner_report()),
    "resource_cleaner_stopped.txt": lambda: cleaner_message(stopped_report()),
    "queue_alarm_split_2_of_2.txt": lambda: queue_alarm_messages(many_problems())[1],
    "queue_alarm_stopped.txt": lambda: queue_alarm_message(stopped_alarm()),
    "resource_cleaner_plan.txt": lambda: cleaner_message(replace(cleaner_report(),
                                                                 planned=True)),
    "resource_cleaner_done.txt": lambda: cleaner_message(outcome_report(), outcome_only=True),
}


def outcome_report() -> CleanerReport:
    """What the deletions of the plan above did: one DLQ refused (AccessDenied)."""
    report = cleaner_report()
    return replace(report, deleted_queues=(
        report.deleted_queues[0],
        Finding("prod-legacy_sync", "empty; no sends or receives in 3 days; DLQ "
                "prod-legacy_sync-dlq NOT deleted (listed under could not clean)")),
        failed=(Finding("prod-legacy_sync-dlq", "not deleted: AccessDenied: User: arn:aws:sts::"
                        "123456789012:assumed-role/cleaner is not authorized to perform: "
                        "sqs:deletequeue; its queue prod-legacy_sync was deleted: this "
                        "dead-letter queue is orphaned, and the next run deletes it"),))


def stopped_alarm() -> QueueAlarmReport:
    return QueueAlarmReport(
        "source", "prod", AT, 250,
        (QueueProblem("prod-orders", "orders", 412, 100, 1800.0, False, "bo", "shop"),),
        stopped="EndpointConnectionError while reading the metrics of prod-payments and 1 "
                "more: Could not connect to the endpoint URL",
        not_checked=("prod-payments", "prod-refunds"),
    )


def stopped_report() -> CleanerReport:
    owned = "team shop · owner ana"
    return CleanerReport(
        namespace="prod", dry_run=False, checked_at=AT, topics_checked=14, queues_checked=120,
        stopped="EndpointConnectionError while judging queue prod-legacy_sync: Could not "
                "connect to the endpoint URL",
        failed=(Finding("prod-locked", "AccessDenied: not authorized to DeleteQueue", None,
                        owned),),
        not_checked=(Finding("prod-legacy_sync", "not judged: the run stopped first"),
                     Finding("prod-promo_2025", "not judged: the run stopped first")),
        deleted_queues=(
            Finding("prod-promo_mailer", "empty; no sends or receives in 3 days; DLQ "
                    "prod-promo_mailer-dlq deleted too", None, owned),
            Finding("prod-old_feed", "empty; no sends or receives in 3 days", None),
        ),
        no_consumers=(Finding("prod-audit_copy", "1,200 messages delivered by its active "
                              "exchange, none received in 3 days", None, "team audit"),),
        kept_topics=(Finding("prod-newsletter", "nothing published or delivered in 1 day; "
                             "subscribed: prod-audit_copy"),),
    )


def many_problems() -> QueueAlarmReport:
    return QueueAlarmReport("source", "prod", AT, 212, tuple(
        QueueProblem(f"prod-q{n:02d}", f"q{n:02d}", 900 - n, 100, 600.0, False, "", "shop")
        for n in range(52)
    ))


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_preview_in_docs_is_current(name: str) -> None:
    rendered = render_text(GOLDEN[name]())
    path = DOCS / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(rendered, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == rendered


def _sections(message: dict[str, Any]) -> list[str]:
    return [b["text"]["text"] for b in message["blocks"] if b["type"] == "section"]


def test_alarm_variants_differ_and_list_critical_first() -> None:
    critical = queue_alarm_message(critical_alarm())
    plain = queue_alarm_message(plain_alarm())

    assert critical["blocks"][0]["text"]["text"] == "🚨 2 critical queues over threshold (+2 more)"
    assert plain["blocks"][0]["text"]["text"] == "⚠️ 2 dead-letter queues over threshold"
    assert _names([critical]) == ["prod-payments", "prod-checkout.fifo", "prod-orders",
                                  "prod-emails", "prod-emails"]  # the last: its malformed tag
    # the digest first; a divider separates the critical queues from the others
    kinds = [b["type"] for b in critical["blocks"]]
    assert kinds == ["header", "context", "section", "section", "section", "divider", "section",
                     "section", "divider", "section"]
    assert _sections(critical)[0] == ("*Digest:* *🔴 Critical: 2* · 🟠 Over threshold: 2 · "
                                      "⚠️ Malformed threshold tags: 1")
    assert "prod-payments" in critical["text"]  # notification fallback
    # every row links to its queue in the console; a DLQ's row says how to inspect and requeue
    assert ("<https://eu-west-1.console.aws.amazon.com/sqs/v3/home?region=eu-west-1#/queues/"
            "https%3A%2F%2Fsqs.eu-west-1.amazonaws.com%2F123456789012%2Fprod-payments|console>"
            ) in _sections(critical)[1]
    assert "inspect: `MESSENGER_NAMESPACE=prod messenger dlq list orders`" in _sections(plain)[0]
    assert ("requeue all: `MESSENGER_NAMESPACE=prod messenger requeue prod-orders-dlq orders`"
            in _sections(plain)[0])
    assert "`prod-emails`: messenger:alarm-threshold=`1e3` is not a whole number" in \
        _sections(critical)[-1]


def _names(messages: list[dict[str, Any]]) -> list[str]:
    """Every `name` in bold or in backticks at the start of a line, in order, over all posts."""
    import re

    found = []
    for message in messages:
        for text in _sections(message):
            found += re.findall(r"^(?:🔴|🟠) \*([^*]+)\*|^• `([^`]+)`", text, re.M)
    return [a or b for a, b in found]


def test_long_alarm_is_split_and_names_every_queue() -> None:
    problems = tuple(
        QueueProblem(f"q{n}", f"q{n}", 1000 - n, 10, 60.0, n < 5) for n in range(200)
    )
    messages = queue_alarm_messages(QueueAlarmReport("source", "", AT, 400, problems),
                                    mention="<!subteam^S123>")

    assert len(messages) == 5  # 47 sections per post at most (header, context, mention)
    assert all(len(m["blocks"]) <= MAX_BLOCKS for m in messages)
    assert all(len(json.dumps(m)) <= MAX_POST_CHARS for m in messages)
    headers = [m["blocks"][0]["text"]["text"] for m in messages]
    assert headers[0] == "🚨 5 critical queues over threshold (+195 more) · part 1 of 5"
    # a later post says what it holds, and where the list stands
    assert headers[1:] == [f"🟠 Over threshold (continued) · part {k} of 5" for k in (2, 3, 4, 5)]
    # every queue is named once, in order, and the critical variant pings its target
    assert _names(messages) == [p.name for p in problems]
    assert "<!subteam^S123>" in messages[0]["text"]
    assert _sections(messages[0])[0] == ("<!subteam^S123> critical queues in this post need "
                                         "attention")
    assert _sections(messages[0])[1] == "*Digest:* *🔴 Critical: 5* · 🟠 Over threshold: 195"
    # 60 critical queues: the mention is in every post that holds one, and only there
    many = tuple(QueueProblem(f"c{n}", f"c{n}", 100, 10, 60.0, n < 60) for n in range(120))
    posts = queue_alarm_messages(QueueAlarmReport("source", "", AT, 120, many), "<!here>")
    assert ["<!here>" in p["text"] for p in posts] == [True, True, False]
    assert posts[1]["blocks"][0]["text"]["text"] == "🔴 Critical (continued) · part 2 of 3"
    plain = queue_alarm_messages(QueueAlarmReport("source", "", AT, 4, problems[6:8]),
                                 mention="<!here>")
    assert "<!here>" not in json.dumps(plain)  # no ping without a critical queue


def test_long_cleaner_report_is_split_and_names_every_resource() -> None:
    findings = tuple(Finding(f"prod-queue-{n:04d}", "x" * 60) for n in range(400))
    report = CleanerReport("prod", True, AT, 0, 2000, stale=findings, no_consumers=findings,
                           failed=(Finding("prod-broken", "AccessDenied: no"),))

    messages = cleaner_messages(report)

    assert len(messages) > 1
    assert all(len(m["blocks"]) <= MAX_BLOCKS for m in messages)
    assert all(len(json.dumps(m)) <= MAX_POST_CHARS for m in messages)
    assert all(len(text) <= MAX_SECTION_CHARS for m in messages for text in _sections(m))
    header = messages[0]["blocks"][0]["text"]["text"]
    assert header == f"🧹 Resource cleaner · dry run · part 1 of {len(messages)}"
    assert messages[1]["blocks"][0]["text"]["text"].startswith(
        "⏳ Queues with stale messages (continued) · part 2 of")
    # what went wrong comes first; every finding is named somewhere
    assert _names(messages) == ["prod-broken", *[f.name for f in findings] * 2]


def test_a_stopped_run_says_so_first_and_names_what_it_did_not_check() -> None:
    report = CleanerReport(
        "prod", False, AT, 3, 10, stopped="EndpointConnectionError while judging queue prod-b",
        deleted_queues=(Finding("prod-a", "empty; no sends or receives in 3 days"),),
        not_checked=(Finding("prod-b", "not judged: the run stopped first"),
                     Finding("prod-c", "not judged: the run stopped first")),
    )
    [message] = cleaner_messages(report)
    assert message["blocks"][0]["text"]["text"] == "🧹 Resource cleaner · stopped early"
    # the context counts what was judged, not what was listed
    assert "11 of 13 topics and queues judged" in message["blocks"][1]["elements"][0]["text"]
    sections = _sections(message)
    assert sections[0].startswith("⛔ *Stopped early:* EndpointConnectionError while judging")
    assert "Only the resources listed as deleted were deleted" in sections[0]
    assert sections[1] == "*Digest:* Not checked: 2 · Unused queues deleted: 1"
    assert _names([message]) == ["prod-b", "prod-c", "prod-a"]


def test_a_stopped_alarm_names_what_it_found_and_what_it_did_not_read() -> None:
    [message] = queue_alarm_messages(stopped_alarm())
    assert message["blocks"][0]["text"]["text"] == (
        "⚠️ 1 queue over threshold · stopped early")
    assert _sections(message)[0].startswith("⛔ *Stopped early:* EndpointConnectionError")
    assert _names([message]) == ["prod-orders", "prod-payments", "prod-refunds"]
    nothing = QueueAlarmReport("dlq", "prod", AT, 0, stopped="ReadTimeoutError while listing "
                               "the queues: ...; no queue was checked")
    [message] = queue_alarm_messages(nothing)
    assert message["blocks"][0]["text"]["text"] == (
        "⛔ Queue alarm stopped early: 0 dead-letter queues not checked")
    assert "no queue was checked" in message["text"]


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "unknown"), (45, "45 s"), (720, "12 min"), (7500, "2 h 5 min"), (190000, "2 d 4 h"),
])
def test_durations_read_well(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


@pytest.mark.parametrize("namespace", ["prod", ""])
def test_dlq_commands_work_as_pasted_in_the_reports_namespace(namespace: str) -> None:
    """The inspect and requeue commands of a DLQ row, pasted into a shell, run in the report's
    namespace: `messenger dlq list orders` alone would look in namespace '(none)'."""
    import re
    import shlex

    from messenger.settings import Settings
    from messenger.tools.cli import build_parser

    # Given a DLQ alarm of a namespace (or of none)
    report = replace(plain_alarm(), namespace=namespace)
    text = _sections(queue_alarm_message(report))[0]
    commands = re.findall(r"(?:inspect|requeue all): `([^`]+)`", text)
    assert len(commands) == 2
    for command in commands:
        # When the shell runs the line: NAME=value words set the environment, the rest is argv
        words = shlex.split(command)
        environ = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
        argv = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
        assert argv[0] == "messenger"
        args = build_parser().parse_args(argv[1:])
        # Then the command parses, and its settings are the report's namespace
        assert Settings.from_env(environ).namespace == namespace
        assert args.command in ("dlq", "requeue")

