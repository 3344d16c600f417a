"""Slack reports: golden text previews in docs/, Slack's limits, the two alarm variants.

After an intended change: UPDATE_GOLDEN=1 pytest tests/unit/test_ops_report.py
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from messenger.ops.findings import CleanerReport, Finding, QueueAlarmReport, QueueProblem
from messenger.ops.report import (
    MAX_BLOCKS,
    MAX_SECTION_CHARS,
    cleaner_message,
    duration,
    queue_alarm_message,
    render_text,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
AT = datetime(2026, 11, 21, 9, 15, tzinfo=UTC)


def critical_alarm() -> QueueAlarmReport:
    return QueueAlarmReport("source", "prod", AT, 212, (
        QueueProblem("prod-payments", "payments", 1840, 500, 7500, True, "ana", "payments"),
        QueueProblem("prod-checkout.fifo", "cart.checkout", 260, 200, 95, True, "", "checkout"),
        QueueProblem("prod-orders", "orders", 4210, 1000, 3 * 86400 + 3600, False, "", "shop"),
        QueueProblem("prod-emails", "emails", 130, 100, None, False),
    ))


def plain_alarm() -> QueueAlarmReport:
    return QueueAlarmReport("dlq", "prod", AT, 212, (
        QueueProblem("prod-orders-dlq", "orders", 37, 0, 2 * 86400 + 4 * 3600, False, "", "shop"),
        QueueProblem("prod-emails-dlq", "emails", 3, 0, 5 * 3600 + 60, False, "bo"),
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
}


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
    names = [s.split("*")[1] for s in _sections(critical)]
    assert names == ["prod-payments", "prod-checkout.fifo", "prod-orders", "prod-emails"]
    # a divider separates the critical queues from the others
    kinds = [b["type"] for b in critical["blocks"]]
    assert kinds == ["header", "context", "section", "section", "divider", "section", "section"]
    assert "prod-payments" in critical["text"]  # notification fallback


def test_long_alarm_stays_within_slack_limits() -> None:
    problems = tuple(
        QueueProblem(f"q{n}", f"q{n}", 1000 - n, 10, 60.0, n < 5) for n in range(200)
    )
    message = queue_alarm_message(QueueAlarmReport("source", "", AT, 400, problems))

    assert len(message["blocks"]) <= MAX_BLOCKS
    assert message["blocks"][-1]["elements"][0]["text"] == "… and 170 more queues over threshold"


def test_long_cleaner_report_stays_within_slack_limits() -> None:
    findings = tuple(Finding(f"prod-queue-{n:04d}", "x" * 60) for n in range(400))
    report = CleanerReport("prod", True, AT, 0, 2000, stale=findings, no_consumers=findings)

    message = cleaner_message(report)

    assert len(message["blocks"]) <= MAX_BLOCKS
    assert all(len(text) <= MAX_SECTION_CHARS for text in _sections(message))
    assert message["blocks"][0]["text"]["text"] == "🧹 Resource cleaner · dry run"


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "unknown"), (45, "45 s"), (720, "12 min"), (7500, "2 h 5 min"), (190000, "2 d 4 h"),
])
def test_durations_read_well(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text
