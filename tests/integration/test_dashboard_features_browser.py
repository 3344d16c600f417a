"""The team dashboard's features in a real browser (headless Chromium through Selenium, as
test_dashboard_browser.py): another site cannot frame it; a viewer signed in through the load
balancer's header reads and cannot act, an operator's requeue shows on the job's timeline with
their name; bulk requeue by filter after a preview; search with its cost; history charts; live
updates of the channel and job pages. With MESSENGER_UPDATE_SCREENSHOT=1 the screenshots go to
docs/ (docs/dashboard.md shows them), otherwise to the test's temporary folder."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.operations.deadletters import DeadLetterWorkbench
from tests.dashboard import ALB_ARN, CLIENT_ID, alb_key_server, served
from tests.integration.test_dashboard_bulk import letter
from tests.integration.test_dlq_workbench import channel

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

DOCS = Path(__file__).resolve().parents[2] / "docs"


def shot(browser, tmp_path: Path, name: str) -> None:
    update = os.environ.get("MESSENGER_UPDATE_SCREENSHOT") == "1"
    assert browser.save_screenshot(str((DOCS if update else tmp_path) / f"dashboard-{name}.png"))


@pytest.fixture
def orders(settings, clients):
    """orders (status tracked): a-1, a-2 ValueError for customer 7, b-1 KeyError; refunds: r-1."""
    sqs = clients.client("sqs")
    resources = channel(settings, clients)
    refunds = channel(settings, clients, name="refunds")
    StatusStore(clients, settings).ensure_table()
    letter(sqs, resources.dlq.url, "a-1", {"customer": {"id": 7}})
    letter(sqs, resources.dlq.url, "a-2", {"customer": {"id": 7}})
    letter(sqs, resources.dlq.url, "b-1", {"customer": {"id": 8}}, error_type="KeyError")
    letter(sqs, refunds.dlq.url, "r-1", {"note": "card declined"}, error_type="TimeoutError")
    return resources


def left(settings, clients):
    return sorted(x.id for x in DeadLetterWorkbench("orders", settings, clients).list().letters)


def test_another_site_cannot_frame_a_page(settings, clients, orders, browser):
    from selenium.webdriver.common.by import By

    with served(settings, clients) as dash:
        class Framer(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(f'<iframe id="f" src="{dash.url}/channels/orders"></iframe>'
                                 .encode())

            def log_message(self, *args) -> None:
                pass

        # Given a page of another origin (another port) framing the channel page
        hostile = ThreadingHTTPServer(("127.0.0.1", 0), Framer)
        threading.Thread(target=hostile.serve_forever, daemon=True).start()
        try:
            browser.get(f"http://localhost:{hostile.server_port}/")
            browser.switch_to.frame(browser.find_element(By.ID, "f"))
            # Then the frame holds no dashboard: no buttons to lure clicks onto
            assert browser.find_elements(By.ID, "delete-selected") == []
            assert "a-1" not in browser.page_source
        finally:
            browser.switch_to.default_content()
            hostile.shutdown()
            hostile.server_close()


def test_viewer_reads_operator_acts_and_is_named_on_the_timeline(settings, clients, orders,
                                                                  browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from messenger.tools.dashboard.auth import AlbIdentity

    wait = WebDriverWait(browser, 30)
    with alb_key_server() as signer:
        identity = AlbIdentity("eu-west-1", ALB_ARN, CLIENT_ID, frozenset({"ops"}),
                               groups_claim="custom:groups", key_url=signer.key_url)

        def sign_in_as(claims: dict) -> None:
            # What the load balancer adds to every request after the login
            browser.execute_cdp_cmd("Network.enable", {})
            browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {
                "x-amzn-oidc-data": signer.token(claims, expires_in=600)}})

        try:
            with served(settings, clients, identity=identity) as dash:
                # Nobody signed in: 401, nothing shown
                browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
                browser.get(dash.url + "/channels/orders")
                assert "Sign-in required" in browser.page_source and "a-1" not in \
                    browser.page_source
                # A viewer reads the letters, and has no buttons
                sign_in_as({"sub": "v", "email": "viewer@example.com",
                            "custom:groups": "readers"})
                browser.get(dash.url + "/channels/orders")
                assert browser.find_element(By.ID, "user").text == \
                    "viewer@example.com (viewer)"
                assert browser.find_elements(By.CSS_SELECTOR, "tr[data-letter]")
                assert browser.find_elements(By.ID, "requeue-selected") == []
                assert browser.find_element(By.ID, "read-only")
                shot(browser, tmp_path, "viewer")
                # An operator requeues a-1 from its page
                sign_in_as({"sub": "o", "email": "ada@example.com", "custom:groups": "ops"})
                browser.get(dash.url + "/channels/orders")
                browser.find_element(By.LINK_TEXT, "a-1").click()
                wait.until(lambda b: b.find_element(By.ID, "requeue-one")).click()
                wait.until(lambda b: b.find_element(By.ID, "confirm")).click()
                outcome = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#outcome li"))
                assert outcome.get_attribute("data-moved") == "1", browser.page_source[-800:]
                # The job's page names who did it
                browser.get(dash.url + "/job?id=a-1")
                row = wait.until(lambda b: b.find_element(
                    By.CSS_SELECTOR, 'tr[data-event="REQUEUED"] td.actor'))
                assert row.text == "ada@example.com"
                shot(browser, tmp_path, "job-timeline")
        finally:
            browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
    assert left(settings, clients) == ["a-2", "b-1"]


def test_bulk_requeue_by_filter_after_a_preview(settings, clients, orders, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    with served(settings, clients) as dash:
        browser.get(dash.url + "/channels/orders")
        # Given the filter: ValueError with customer.id 7
        browser.find_element(By.NAME, "error_type").send_keys("ValueError")
        browser.find_element(By.NAME, "body_field").send_keys("customer.id")
        browser.find_element(By.NAME, "body_value").send_keys("7")
        browser.find_element(By.ID, "preview").click()
        # Then the preview ticks exactly a-1 and a-2
        summary = wait.until(lambda b: b.find_element(By.ID, "selection-summary"))
        assert summary.get_attribute("data-matched") == "2"
        ticked = [r.get_attribute("data-letter") for r in browser.find_elements(
            By.CSS_SELECTOR, "tr[data-letter]")
            if r.find_element(By.NAME, "ids").is_selected()]
        assert sorted(ticked) == ["a-1", "a-2"]
        shot(browser, tmp_path, "filter-preview")
        # When they are requeued and confirmed
        browser.find_element(By.ID, "requeue-chosen").click()
        wait.until(lambda b: b.find_element(By.ID, "confirm")).click()
        outcome = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#outcome li"))
        assert outcome.get_attribute("data-moved") == "2"
    assert left(settings, clients) == ["b-1"]


def test_search_history_and_live_pages(settings, clients, orders, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    sqs = clients.client("sqs")
    store = StatusStore(clients, settings)
    store.record(StatusRecord("a-2", StatusEvent.QUEUED, "orders"))
    store.flush()
    with served(settings, clients, refresh=1) as dash:
        # Search: text in a body, across channels, with its cost
        browser.get(dash.url + "/search")
        browser.find_element(By.NAME, "text").send_keys("card declined")
        browser.find_element(By.ID, "search-button").click()
        cost = wait.until(lambda b: b.find_element(By.ID, "search-cost"))
        assert int(cost.get_attribute("data-requests")) > 0
        assert [r.get_attribute("data-letter") for r in browser.find_elements(
            By.CSS_SELECTOR, "#search-results tr[data-letter]")] == ["r-1"]
        shot(browser, tmp_path, "search")
        # History: six charts drawn from the metrics
        sqs.send_message(QueueUrl=orders.queue.url, MessageBody='{"n": 1}')
        browser.get(dash.url + "/channels/orders/history?window=hour")
        charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
        assert len(charts) == 6 and charts[0].size["width"] > 100
        assert charts[0].get_attribute("data-total") == "1"
        shot(browser, tmp_path, "history")
        # The channel page updates its counts by itself
        browser.get(dash.url + "/channels/orders")
        browser.execute_script("window.notReloaded = true;")
        visible = 'tbody#channel-counts td[data-field="visible"]'
        assert browser.find_element(By.CSS_SELECTOR, visible).text == "1"
        sqs.send_message(QueueUrl=orders.queue.url, MessageBody='{"n": 2}')
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, visible).text == "2")
        # ... and the job page its timeline
        browser.get(dash.url + "/job?id=a-2")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, 'tr[data-event="QUEUED"]'))
        browser.execute_script("window.notReloaded = true;")
        store.record(StatusRecord("a-2", StatusEvent.REQUEUED, "orders", actor="bob"))
        store.flush()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, 'tr[data-event="REQUEUED"]'))
        assert browser.execute_script("return window.notReloaded === true;")
        # Times in UTC, the local time on hover
        stamp = browser.find_element(By.CSS_SELECTOR, "#timeline time")
        assert stamp.get_attribute("title").startswith("local time: ")
