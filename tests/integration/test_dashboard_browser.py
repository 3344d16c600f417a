"""The dashboard in a real browser (headless Chromium through Selenium, started once per
session): the overview lists a channel with dead letters and updates by itself, a letter's page
shows its traceback, and its Requeue button (then the confirmation) moves exactly that letter.
The test takes a screenshot of the letter's page; with MESSENGER_UPDATE_SCREENSHOT=1 it is written
to docs/dashboard.png (the README's picture), otherwise to the test's temporary folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from messenger import Message
from messenger.operations.deadletters import DeadLetterWorkbench
from tests.dashboard import served
from tests.integration.helpers import decode, drain
from tests.integration.test_dlq_workbench import TRACEBACK, channel, dead_letter

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "dashboard.png"


def test_browse_requeue_one_and_watch_the_overview_update(settings, clients, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # Given 'orders' with three dead letters (consumer verdicts with tracebacks)
    resources = channel(settings, clients)
    sqs = clients.client("sqs")
    for n in range(3):
        dead_letter(sqs, resources.dlq.url, Message({"order": n}, message_id=f"job-{n}"))
    wait = WebDriverWait(browser, 30)

    def cell(field: str) -> str:
        return str(browser.find_element(
            By.CSS_SELECTOR, f'tr[data-channel="orders"] td[data-field="{field}"]').text)

    with served(settings, clients, refresh=1) as dash:
        # The overview lists the channel and its DLQ depth
        browser.get(dash.url + "/")
        assert (cell("visible"), cell("dlq_depth")) == ("0", "3")
        # It updates by itself when a message arrives: the rows change, the page is the same
        browser.execute_script("window.notReloaded = true;")
        sqs.send_message(QueueUrl=resources.queue.url, MessageBody='{"order": 9}')
        wait.until(lambda _: cell("visible") == "1")
        assert browser.execute_script("return window.notReloaded === true;")
        # The channel page lists the letters; job-1's page shows the full traceback
        browser.find_element(By.LINK_TEXT, "orders").click()
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "tr[data-letter]")) == 3)
        browser.find_element(By.LINK_TEXT, "job-1").click()
        traceback = wait.until(lambda b: b.find_element(By.ID, "traceback"))
        assert traceback.text.strip() == TRACEBACK.strip()
        update = os.environ.get("MESSENGER_UPDATE_SCREENSHOT") == "1"
        assert browser.save_screenshot(str(SCREENSHOT if update else tmp_path / "dashboard.png"))
        # Requeue, then confirm: the outcome is shown as it happened
        browser.find_element(By.ID, "requeue-one").click()
        wait.until(lambda b: b.find_element(By.ID, "confirm")).click()
        outcome = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#outcome li"))
        assert (outcome.get_attribute("data-moved"), outcome.get_attribute("data-failed"),
                outcome.get_attribute("data-in-flight")) == ("1", "0", "0")
    # Exactly that letter moved: the DLQ holds the others, the queue job-1 (and the new one)
    listing = DeadLetterWorkbench("orders", settings, clients).list()
    assert sorted(x.id for x in listing.letters) == ["job-0", "job-2"]
    queued = [decode(m) for m in drain(sqs, resources.queue.url)]
    assert sorted(m.message_id for m in queued if m.message_id.startswith("job-")) == ["job-1"]
    assert len(queued) == 2
