"""The operator's consumer controls in a real browser (headless Chromium through Selenium, as
test_dashboard_features_browser.py), signed in through the load balancer's header as an
operator: pause and resume a channel from its page (the queue's tag, the paused line on the
overview and channel pages), and cancel a job a real `messenger consume` process is running
(tests/reliability's harness) from its page: dead-lettered "cancelled by <who>", CANCELLED with
who on the job's timeline. With MESSENGER_UPDATE_SCREENSHOT=1 the screenshots go to docs/."""

from __future__ import annotations

import time

import pytest

from messenger import Producer
from tests.dashboard import signed_in
from tests.integration.test_dashboard_features_browser import shot
from tests.integration.test_dlq_workbench import channel
from tests.reliability.apps import CHANNEL
from tests.reliability.conftest import Harness

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("jwt", reason="the dashboard extra is not installed")

OPERATOR = {"sub": "o", "email": "ada@example.com", "custom:groups": "ops"}
PAUSE_TAG = "messenger:paused"


def as_operator(browser, settings, clients, refresh: float = 5.0):
    """The dashboard deployed-style, the browser sending an operator's signed header: its URL."""
    return signed_in(browser, settings, clients, OPERATOR, refresh)


def paused_lines(browser) -> list[str]:
    from selenium.webdriver.common.by import By

    return [p.text for p in browser.find_elements(By.CSS_SELECTOR, "p[data-paused]")]


def test_an_operator_pauses_and_resumes_a_channel_in_the_browser(settings, clients, browser,
                                                                 tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    sqs = clients.client("sqs")
    resources = channel(settings, clients)
    channel(settings, clients, name="refunds")
    with as_operator(browser, settings, clients) as url:
        # Given the channel page of 'orders', not paused
        browser.get(url + "/channels/orders")
        assert paused_lines(browser) == []
        # When the operator pauses it and confirms
        browser.find_element(By.ID, "pause").click()
        question = wait.until(lambda b: b.find_element(By.ID, "question"))
        assert "Pause the consumers of orders?" in question.text
        browser.find_element(By.ID, "confirm").click()
        outcome = wait.until(lambda b: b.find_element(By.ID, "outcome"))
        assert "orders" in outcome.text, browser.page_source[-1500:]
        # Then the queue carries the tag, naming the operator
        tags = sqs.list_queue_tags(QueueUrl=resources.queue.url).get("Tags") or {}
        assert tags.get(PAUSE_TAG, "").startswith("ada@example.com@"), tags
        # and the overview says so: a line naming who, 'paused' on the channel's row only
        browser.get(url + "/")
        (line,) = paused_lines(browser)
        assert "orders" in line and "paused by ada@example.com at " in line, line
        marks = browser.find_elements(By.CSS_SELECTOR, '[data-field="paused"]')
        assert marks and all(m.find_element(By.XPATH, "./..").text.startswith("orders")
                             for m in marks)
        # and the channel page too, which now offers Resume
        browser.find_element(By.CSS_SELECTOR, 'p[data-paused="orders"] a').click()
        resume = wait.until(lambda b: b.find_element(By.ID, "resume"))
        assert browser.find_elements(By.ID, "pause") == []
        (line,) = paused_lines(browser)
        assert "paused by ada@example.com at " in line
        shot(browser, tmp_path, "paused")
        # When the operator resumes it and confirms
        resume.click()
        question = wait.until(lambda b: b.find_element(By.ID, "question"))
        assert "Resume the consumers of orders?" in question.text
        browser.find_element(By.ID, "confirm").click()
        wait.until(lambda b: b.find_element(By.ID, "outcome"))
        # Then the tag is gone and no page shows the line
        assert PAUSE_TAG not in (sqs.list_queue_tags(QueueUrl=resources.queue.url).get("Tags")
                                 or {})
        browser.get(url + "/")
        assert paused_lines(browser) == []
        assert browser.find_elements(By.CSS_SELECTOR, '[data-field="paused"]') == []
        browser.get(url + "/channels/orders")
        assert paused_lines(browser) == [] and browser.find_element(By.ID, "pause")


@pytest.mark.timeout(180)
def test_an_operator_cancels_a_running_job_from_its_page(settings, clients, browser, tmp_path):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    # (the live timeline replaces the button every second: a click may find it just replaced)
    clicking = WebDriverWait(browser, 30, ignored_exceptions=(NoSuchElementException,
                                                              StaleElementReferenceException))

    class Jobs(Producer):
        channel = CHANNEL
        track_status = True

    # Given a long job running on a real consumer process (status tracked)
    harness = Harness(settings, clients, tmp_path)
    try:
        job = Jobs(settings=settings).push({"sleep": 90})
        consumer = harness.start("TrackedAttemptsConsumer")
        deadline = time.monotonic() + 30
        while not harness.lines("attempts") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert harness.lines("attempts"), consumer.log_path.read_text()[-3000:]
        with as_operator(browser, settings, clients, refresh=1) as url:
            # When the operator opens its page (perhaps before its consumer's STARTED is
            # recorded: the Cancel button comes with the live timeline), clicks Cancel, confirms
            browser.get(url + f"/job?id={job}")
            wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, 'tr[data-event="STARTED"]'))
            clicking.until(lambda b: b.find_element(By.ID, "cancel-job").click() or True)
            question = wait.until(lambda b: b.find_element(By.ID, "question"))
            assert 'cancelled by ada@example.com' in question.text
            browser.find_element(By.ID, "confirm").click()
            outcome = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#outcome li"))
            assert f"cancel of {job} requested by ada@example.com" in outcome.text
            # Then its consumer stops it at its next heartbeat and dead-letters it
            dead = consumer.wait_for(lambda e: e.get("event") == "dead_lettered", timeout=30)
            assert dead["reason"] == "cancelled by ada@example.com"
            # and the job's page shows CANCELLED with who, then DEAD_LETTERED
            browser.get(url + f"/job?id={job}")
            actor = wait.until(lambda b: b.find_element(
                By.CSS_SELECTOR, 'tr[data-event="CANCELLED"] td.actor'))
            assert actor.text == "ada@example.com"
            wait.until(lambda b: b.find_elements(By.CSS_SELECTOR,
                                                 'tr[data-event="DEAD_LETTERED"]'))
            assert browser.find_elements(By.ID, "cancel-job") == []
            browser.execute_script("document.getElementById('timeline').scrollIntoView();")
            shot(browser, tmp_path, "cancelled")
        assert consumer.terminate() == 0
        # and the job is in the DLQ with the reason, not processed
        ledger = harness.collect([job])
        assert ledger.in_dlq == [job] and ledger.processed == []
        assert ledger.dlq_reasons[job] == "cancelled by ada@example.com"
    finally:
        for started in harness.started:
            started.stop()
