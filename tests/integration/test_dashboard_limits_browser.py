"""A channel's limits in a real browser (headless Chromium through Selenium, signed in as an
operator through the load balancer's header): the Limits section follows the consumers' reports
by itself, and the operator lowers the rate limit from the channel page after a confirmation."""

from __future__ import annotations

import time

import pytest

from messenger import ChannelSpec
from messenger.channel import Rate
from messenger.jobs.limits import LimitStore
from messenger.provision import Provisioner
from tests.integration.test_dashboard_controls_browser import as_operator

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("jwt", reason="the dashboard extra is not installed")


def _cell(browser, limit: str) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(
        By.CSS_SELECTOR, f'tr[data-limit="{limit}"] td[data-field="value"]').text


def test_an_operator_watches_and_lowers_a_channels_rate_limit(settings, clients, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        "orders", namespace=settings.namespace, rate_limit="50/s"))
    store = LimitStore(clients, settings)
    store.ensure()
    with as_operator(browser, settings, clients, refresh=1.0) as url:
        # Given the channel page, no consumer reporting yet
        browser.get(url + "/channels/orders")
        assert _cell(browser, "rate_limit") == "50/s"
        assert browser.find_element(By.CSS_SELECTOR, '#flow [data-field="rate"]').text == "-"
        # When a consumer process reports (stamped an hour ahead: fresh however slow the run)
        LimitStore(clients, settings, clock=lambda: time.time() + 3600).report(
            "orders", "task-1", 48.0, 5)
        # Then the page shows its rate and jobs waiting without a reload
        wait.until(lambda b: b.find_element(
            By.CSS_SELECTOR, '#flow [data-field="waiting"]').text == "5")
        assert browser.find_element(By.CSS_SELECTOR, '#flow [data-field="rate"]').text == "48.0"
        # When the operator lowers the rate and confirms
        browser.find_element(By.NAME, "rate_limit").send_keys("10/s")
        browser.find_element(By.ID, "set-limits").click()
        question = wait.until(lambda b: b.find_element(By.ID, "question"))
        assert "Change the limits of orders?" in question.text
        changes = browser.find_element(By.ID, "limit-changes").text
        assert changes == "rate_limit: 50/s → 10/s"
        browser.find_element(By.ID, "confirm").click()
        outcome = wait.until(lambda b: b.find_element(By.ID, "outcome"))
        assert "10/s" in outcome.text, browser.page_source[-1500:]
        # Then consumers read it, and the channel page says it was set at run time
        assert store.get("orders").rate_limit == Rate(10, 1, "s")
        browser.get(url + "/channels/orders")
        assert _cell(browser, "rate_limit") == "10/s"
        row = browser.find_element(By.CSS_SELECTOR, 'tr[data-limit="rate_limit"]').text
        assert "set at run time" in row and "50/s" in row
