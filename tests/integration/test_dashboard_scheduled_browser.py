"""Scheduled jobs in a real browser (headless Chromium through Selenium, as
test_dashboard_features_browser.py): two jobs waiting in EventBridge Scheduler (local endpoint)
listed with their due time in UTC and the local time on hover; the local operator cancels one
through the page's checkbox, button and confirmation: the page says so, the list and Scheduler
no longer have it, its page shows CANCELLED by the operator; a viewer signed in through the load
balancer's header sees the list and no Cancel control. The list updates by itself: a job
scheduled after the page opened appears, one cancelled elsewhere or fired goes, and the boxes the
operator ticked stay ticked for the Cancel form. With MESSENGER_UPDATE_SCREENSHOT=1 the
screenshot goes to docs/ (docs/dashboard.md shows it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo

import pytest

from messenger import Producer
from messenger.channel import schedule_group_name
from messenger.jobs.schedule_store import ScheduleStore
from messenger.jobs.schedules import schedule_name
from tests.dashboard import served, signed_in
from tests.integration.test_dashboard_features_browser import shot
from tests.integration.test_dlq_workbench import channel

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

VIEWER = {"sub": "v", "email": "viewer@example.com", "custom:groups": "readers"}
#: The browser's zone and locale while the page is read: +05:30 moves the minutes too, so the
#: hover text can only match if the page converted the UTC time.
LOCAL_ZONE, LOCAL_LOCALE = "Asia/Kolkata", "en-GB"
#: A job id a page must escape (HTML) and quote (links, forms): '/', '&', '#', '<', '"'.
AWKWARD_ID = 'reports/2030<b>"q1"</b>&#1'


class Nightly(Producer):
    channel = "nightly"
    track_status = True


class OrderedNightly(Producer):
    """nightly's ordered (FIFO) side: any at= is a Scheduler schedule, seconds ahead too."""

    channel = "nightly"
    ordered = True


def due_in(hours: int) -> datetime:
    """A due time this many hours ahead, whole seconds (Scheduler's at() has no fractions)."""
    return (datetime.now(UTC) + timedelta(hours=hours)).replace(microsecond=0)


@contextmanager
def local_clock(browser) -> Iterator[None]:
    """The browser in LOCAL_ZONE and LOCAL_LOCALE for the block (CDP), then back to its own."""
    browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": LOCAL_ZONE})
    browser.execute_cdp_cmd("Emulation.setLocaleOverride", {"locale": LOCAL_LOCALE})
    try:
        yield
    finally:
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})
        browser.execute_cdp_cmd("Emulation.setLocaleOverride", {})


def listed(browser) -> list[str]:
    from selenium.webdriver.common.by import By

    return [row.get_attribute("data-job") for row in
            browser.find_elements(By.CSS_SELECTOR, "#scheduled-jobs tr[data-job]")]


def row_of(browser, job_id: str):
    from selenium.webdriver.common.by import By

    (row,) = [row for row in browser.find_elements(By.CSS_SELECTOR, "#scheduled-jobs tr[data-job]")
              if row.get_attribute("data-job") == job_id]
    return row


def schedules_left(clients, settings) -> list[str]:
    """The names of the namespace's schedules in Scheduler, read there."""
    pages = clients.client("scheduler").get_paginator("list_schedules").paginate(
        GroupName=schedule_group_name(settings.namespace))
    return sorted(s["Name"] for page in pages for s in page["Schedules"])


def test_an_operator_cancels_a_scheduled_job_in_the_browser(settings, clients, browser,
                                                            tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    # Given two jobs due in 2 and 3 hours (past SQS's 15 minutes: Scheduler's schedules), the
    # sooner with an id a page must escape and quote
    channel(settings, clients, name="nightly")
    producer = Nightly(settings=settings, clients=clients)
    sooner_due, later_due = due_in(2), due_in(3)
    sooner = producer.push({"n": 1}, at=sooner_due, message_id=AWKWARD_ID)
    later = producer.push({"n": 2}, at=later_due)
    assert sooner == AWKWARD_ID and sooner.scheduled and later.scheduled
    producer.status.flush()
    names = sorted(schedule_name("nightly", job) for job in (sooner, later))
    assert schedules_left(clients, settings) == names
    with served(settings, clients) as dash, local_clock(browser):
        # When the operator opens them from the channel's page
        browser.get(dash.url + "/channels/nightly")
        browser.find_element(By.ID, "scheduled-link").click()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#scheduled-jobs tr[data-job]"))
        # Then both are listed, soonest first, each due in UTC with the local time on hover
        assert listed(browser) == [sooner, later]
        for job, due in ((sooner, sooner_due), (later, later_due)):
            shown = row_of(browser, job).find_element(By.CSS_SELECTOR, "time[datetime]")
            assert shown.text == f"{due:%Y-%m-%d %H:%M:%S}"
            assert shown.get_attribute("datetime") == f"{due:%Y-%m-%dT%H:%M:%SZ}"
            local = due.astimezone(ZoneInfo(LOCAL_ZONE))
            wait.until(lambda b, node=shown: node.get_attribute("title"))
            assert shown.get_attribute("title") == f"local time: {local:%d/%m/%Y, %H:%M:%S}"
        # and the id shows as text (escaped), its link naming exactly that job
        link = row_of(browser, sooner).find_element(By.TAG_NAME, "a")
        assert link.text == AWKWARD_ID
        assert parse_qs(urlsplit(link.get_attribute("href")).query) == {"id": [AWKWARD_ID]}
        # When the operator ticks the sooner one and asks to cancel it
        row_of(browser, sooner).find_element(By.NAME, "ids").click()
        shot(browser, tmp_path, "scheduled")
        browser.find_element(By.ID, "cancel-selected").click()
        question = wait.until(lambda b: b.find_element(By.ID, "question"))
        # Then the page asks first, naming it, and nothing is cancelled yet
        assert "Cancel 1 scheduled job(s) of nightly before they fire?" in question.text
        assert [li.text for li in browser.find_elements(By.CSS_SELECTOR, "main ul li")] == \
            [AWKWARD_ID]
        assert browser.find_element(By.ID, "confirm").text == "Yes, cancel"
        assert schedules_left(clients, settings) == names
        # When the operator takes the way back beside "Yes, cancel" (not a second "Cancel")
        back = browser.find_element(By.ID, "cancel")
        assert back.text == "No, keep it"
        back.click()
        # Then both jobs are still listed and scheduled
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#scheduled-jobs tr[data-job]"))
        assert listed(browser) == [sooner, later]
        assert schedules_left(clients, settings) == names
        # When the operator asks again and confirms
        row_of(browser, sooner).find_element(By.NAME, "ids").click()
        browser.find_element(By.ID, "cancel-selected").click()
        wait.until(lambda b: b.find_element(By.ID, "confirm")).click()
        outcome = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#outcome li"))
        # Then the page says it was cancelled, by whom, linking the job's page
        assert outcome.get_attribute("data-cancelled") == "yes"
        assert outcome.text == f"{AWKWARD_ID}: cancelled by local operator"
        assert browser.find_element(By.TAG_NAME, "h1").text == "Cancelled"
        job_page = outcome.find_element(By.TAG_NAME, "a").get_attribute("href")
        assert parse_qs(urlsplit(job_page).query) == {"id": [AWKWARD_ID]}
        # and Scheduler no longer has its schedule, only the other's
        assert schedules_left(clients, settings) == [schedule_name("nightly", later)]
        # and the list no longer shows it
        browser.find_element(By.ID, "back-to-scheduled").click()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#scheduled-jobs tr[data-job]"))
        assert listed(browser) == [later]
        # and its page ends its timeline CANCELLED, by the local operator, before it was due
        browser.get(job_page)
        cancelled = wait.until(lambda b: b.find_element(
            By.CSS_SELECTOR, 'tr[data-event="CANCELLED"]'))
        assert cancelled.find_element(By.CSS_SELECTOR, "td.actor").text == "local operator"
        assert (f"cancelled by local operator before it was due "
                f"({sooner_due:%Y-%m-%d %H:%M:%S} UTC)") in cancelled.text
        events = [r.get_attribute("data-event") for r in
                  browser.find_elements(By.CSS_SELECTOR, "#timeline tr[data-event]")]
        assert events == ["SCHEDULED", "CANCELLED"]
        assert browser.find_element(By.TAG_NAME, "h1").text == f"Job {AWKWARD_ID}"


def test_a_viewer_sees_scheduled_jobs_and_no_cancel(settings, clients, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    pytest.importorskip("jwt", reason="the dashboard extra is not installed")
    wait = WebDriverWait(browser, 30)
    # Given a job due in 2 hours
    job = Nightly(settings=settings, clients=clients).push({"n": 1}, at=due_in(2))
    # When a viewer, signed in through the load balancer, opens the channel's scheduled jobs
    with signed_in(browser, settings, clients, VIEWER) as url:
        browser.get(url + "/channels/nightly/scheduled")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#scheduled-jobs tr[data-job]"))
        # Then the job is listed, and there is nothing to cancel it with
        assert browser.find_element(By.ID, "user").text == "viewer@example.com (viewer)"
        assert listed(browser) == [job]
        assert browser.find_elements(By.NAME, "ids") == []
        assert browser.find_elements(By.ID, "cancel-selected") == []
    assert schedules_left(clients, settings) == [schedule_name("nightly", job)]


#: The job ids listed, and those ticked, read in one script (atomic: a live update replaces the
#: rows between two Selenium calls).
LISTED = ("return Array.from(document.querySelectorAll('#scheduled-jobs tr[data-job]'))"
          ".map(function (row) { return row.dataset.job; });")
TICKED = ("return Array.from(document.querySelectorAll('#scheduled-jobs input[name=ids]:checked'))"
          ".map(function (box) { return box.value; });")


def tick(browser, job_id: str) -> None:
    """Click the job's box as the operator does, again if a live update replaced the row
    between finding the box and clicking it (the click then never happened)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def click(b) -> bool:
        row_of(b, job_id).find_element("name", "ids").click()
        return True

    WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,)).until(click)


def test_the_list_updates_by_itself_and_keeps_the_ticks(settings, clients, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30)
    producer = Nightly(settings=settings, clients=clients)
    with served(settings, clients, refresh=1) as dash:
        # Given the operator on nightly's scheduled jobs, none yet
        browser.get(dash.url + "/channels/nightly/scheduled")
        assert browser.execute_script(LISTED) == []
        assert browser.find_elements(By.ID, "cancel-selected") == []
        browser.execute_script("window.notReloaded = true;"
                               "window.shownList = document.getElementById('scheduled-jobs');")
        # Then an update that finds the list unchanged leaves it alone (nothing the operator
        # points at is replaced)
        wait.until(lambda b: b.find_element(By.CLASS_NAME, "live-stamp").text.startswith(
            "updated "))
        assert browser.execute_script(
            "return document.getElementById('scheduled-jobs') === window.shownList;")
        # When jobs are scheduled after the page opened: in 2 and 3 hours, and one (ordered:
        # Scheduler's) in 25 s
        kept, other = producer.push({"n": 1}, at=due_in(3)), producer.push({"n": 2}, at=due_in(2))
        soon = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=25)
        firing = OrderedNightly(settings=settings, clients=clients).push({"n": 3}, at=soon)
        # Then they appear, soonest first, with the Cancel button
        wait.until(lambda b: b.execute_script(LISTED) == [firing, other, kept])
        assert browser.find_element(By.ID, "cancel-selected").is_displayed()
        # When the operator ticks one, and another job is scheduled meanwhile
        tick(browser, kept)
        newer = producer.push({"n": 4}, at=due_in(1))
        wait.until(lambda b: newer in b.execute_script(LISTED))
        # Then the tick stays through the update
        assert browser.execute_script(TICKED) == [kept]
        # When one is cancelled elsewhere (the library, as `messenger schedules cancel`) and the
        # ordered one fires (the local endpoint's Scheduler, at its time)
        ScheduleStore(clients, settings).cancel(other, "nightly", actor="ada")
        WebDriverWait(browser, 60).until(lambda b: b.execute_script(LISTED) == [newer, kept])
        # Then both are gone without a reload, and the tick is still there
        assert browser.execute_script("return window.notReloaded === true;")
        assert browser.execute_script(TICKED) == [kept]
        # When the operator cancels the selection, confirmed
        browser.find_element(By.ID, "cancel-selected").click()
        question = wait.until(lambda b: b.find_element(By.ID, "question"))
        # Then exactly the ticked job was asked about, and only it is cancelled
        assert [li.text for li in browser.find_elements(By.CSS_SELECTOR, "main ul li")] == [kept]
        assert "Cancel 1 scheduled job(s) of nightly" in question.text
        browser.find_element(By.ID, "confirm").click()
        outcome = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#outcome li"))
        assert outcome.get_attribute("data-cancelled") == "yes"
    assert schedules_left(clients, settings) == [schedule_name("nightly", newer)]
