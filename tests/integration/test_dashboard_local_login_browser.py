"""`messenger dashboard --login` in a real browser (headless Chromium through Selenium): the
cookies it relies on (the sign-in's, HttpOnly and SameSite=Strict, and the `__Host-` CSRF
cookie, Secure, on http://127.0.0.1) are kept by the browser, so a viewer signed in on the page
sees no actions, and an operator signed in there deletes a letter through the confirmation and
finds both on the Audit page."""

from __future__ import annotations

import pytest

from messenger import Message
from messenger.operations.deadletters import DeadLetterWorkbench
from tests.dashboard import free_port
from tests.integration.test_dlq_workbench import channel, dead_letter

pytest.importorskip("jwt", reason="the dashboard extra is not installed")


def test_sign_in_locally_as_viewer_then_operator(settings, clients, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from messenger.tools.dashboard.app import Dashboard, running
    from messenger.tools.dashboard.local_login import LocalLogin

    resources = channel(settings, clients)
    for n in range(2):
        dead_letter(clients.client("sqs"), resources.dlq.url,
                    Message({"n": n}, message_id=f"job-{n}"))
    wait = WebDriverWait(browser, 30)
    port = free_port()
    login = LocalLogin(port)
    dashboard = Dashboard(settings, clients, port, identity=login.identity(), local_login=login)
    with running(dashboard) as url:
        try:
            # Not signed in: the sign-in page; the viewer reads and has no actions
            browser.get(url + "/channels/orders")
            wait.until(lambda b: b.find_element(By.ID, "as-viewer")).click()
            wait.until(lambda b: b.find_element(By.ID, "user"))
            browser.get(url + "/channels/orders")
            assert browser.find_element(By.ID, "user").text == "viewer@example.com (viewer)"
            assert browser.find_elements(By.CSS_SELECTOR, "tr[data-letter]")
            assert browser.find_elements(By.CSS_SELECTOR, "input[type=checkbox]") == []
            # The operator ticks job-0, deletes it after the confirmation
            browser.get(url + "/local-login")
            browser.find_element(By.ID, "as-operator").click()
            wait.until(lambda b: b.find_element(By.ID, "user"))
            browser.get(url + "/channels/orders")
            assert browser.find_element(By.ID, "user").text == \
                "operator@example.com (operator)"
            browser.find_element(By.CSS_SELECTOR, 'tr[data-letter="job-0"] input').click()
            browser.find_element(By.ID, "delete-selected").click()
            wait.until(lambda b: b.find_element(By.ID, "confirm")).click()
            outcome = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#outcome li"))
            assert outcome.get_attribute("data-deleted") == "1", browser.page_source[-800:]
            # ... and the Audit page shows the delete, with the local operator's sub
            browser.find_element(By.ID, "audit-link").click()
            row = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#audit tr[data-action]"))
            assert row.get_attribute("data-action") == "delete"
            assert row.get_attribute("data-result") == "done"
            assert row.find_element(By.CSS_SELECTOR, "td.sub").text == "local-operator-1"
        finally:
            browser.delete_all_cookies()
    assert [x.id for x in DeadLetterWorkbench("orders", settings, clients).list().letters] \
        == ["job-1"]
