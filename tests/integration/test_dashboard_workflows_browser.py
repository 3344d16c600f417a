"""The dashboard's job and group pages for results and workflows (issue 52), in a real browser
(headless Chromium through Selenium, as test_dashboard_browser.py): a group's progress while its
members run, updated live; the callback's page with its result and each member's outcome; a
member's page with its error and what waits on it; a held job's page before its first status
record. Real consumers on the moto server."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from messenger import Producer, Unrecoverable
from messenger.produce.producer import PushItem
from tests.dashboard import served
from tests.integration.test_consumer_runtime import (  # noqa: F401 - fixtures
    Recording,
    running,
    runtime,
    wait_until,
)

pytest.importorskip("starlette", reason="the dashboard extra is not installed")


class PartsConsumer(Recording):
    """A member returns {"part": n}; n == 1 fails for good; n == 2 waits for `gate`. The
    group's callback returns how many of its members completed."""

    channel = "dash_parts"
    track_status = True
    keep_results = True
    gate = threading.Event()

    def handler(self, message: Any) -> Any:
        super().handler(message)
        if message.body == "report":
            return {"completed": sum(1 for d in message.dependencies.values()
                                     if not isinstance(d, Exception))}
        if message.body["n"] == 1:
            raise Unrecoverable("part 1 is corrupt")
        if message.body["n"] == 2:
            assert self.gate.wait(60)
        return {"part": message.body["n"]}


class Parts(Producer):
    channel = "dash_parts"
    track_status = True


@pytest.fixture(autouse=True)
def open_gate():
    PartsConsumer.gate.clear()
    yield
    PartsConsumer.gate.set()


def test_a_groups_progress_its_callbacks_result_and_a_members_error(
        settings, clients, browser, running) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # (generous: at a load of 20 on 2 cores the consumer's first jobs took over 30 s)
    wait = WebDriverWait(browser, 120)
    # Given a group of three parts and a report callback, the consumer running: part 0
    # completes, part 1 fails for good, part 2 waits
    run = running(PartsConsumer)
    wait_until(lambda: run.consumer.resources, timeout=120)
    group = Parts(settings=settings, clients=clients).group(
        [{"n": n} for n in range(3)], then=PushItem("report"))
    member = dict(enumerate(group.member_ids))
    with served(settings, clients, refresh=0.5) as dash:
        # When an operator opens the group's page
        browser.get(f"{dash.url}/groups/{group.group_id}")
        # Then it shows 2 of 3 finished, one failed, the callback still held
        progress = wait.until(lambda b: (e := b.find_element(By.ID, "group-progress"))
                              .get_attribute("data-finished") == "2" and e)
        assert progress.get_attribute("data-total") == "3"
        assert progress.get_attribute("data-state") == "HELD"
        rows = {r.get_attribute("data-job"): r.get_attribute("data-outcome")
                for r in browser.find_elements(By.CSS_SELECTOR, "#group-members tbody tr")}
        assert rows == {member[0]: "completed", member[1]: "dead_lettered",
                        member[2]: "pending"}
        # When the last part finishes, then the page follows by itself: all finished, the
        # callback released
        PartsConsumer.gate.set()
        wait.until(lambda b: b.find_element(By.ID, "group-progress")
                   .get_attribute("data-state") == "RELEASED")
        assert browser.find_element(By.ID, "group-progress").get_attribute(
            "data-finished") == "3"
        # And the callback's page shows its result and what it waited for
        browser.find_element(By.ID, "group-then").click()
        outcome = wait.until(lambda b: b.find_element(By.ID, "job-outcome"))
        assert outcome.get_attribute("data-outcome") == "completed"
        assert '"completed": 2' in browser.find_element(By.ID, "job-result").text
        assert browser.find_element(By.ID, "job-waiting").get_attribute("data-state") == \
            "RELEASED"
        assert browser.find_element(By.ID, "job-group").text == group.group_id
        deps = {r.get_attribute("data-job"): r.get_attribute("data-outcome")
                for r in browser.find_elements(By.CSS_SELECTOR, "#job-dependencies tbody tr")}
        assert deps == {member[0]: "completed", member[1]: "dead_lettered",
                        member[2]: "completed"}
        # And the failed part's page shows its error, and the callback waiting on it
        browser.find_element(By.LINK_TEXT, member[1]).click()
        outcome = wait.until(lambda b: b.find_element(By.ID, "job-outcome"))
        assert outcome.get_attribute("data-outcome") == "dead_lettered"
        assert outcome.find_element(By.CLASS_NAME, "error-type").text == "Unrecoverable"
        assert outcome.find_element(By.CLASS_NAME, "error-message").text == \
            "part 1 is corrupt"
        assert browser.find_elements(By.ID, "job-result") == []
        dependents = [li.get_attribute("data-job") for li in
                      browser.find_elements(By.CSS_SELECTOR, "#job-dependents li")]
        assert dependents == [group.then_id]


def test_a_held_job_has_a_page_before_its_first_record(settings, clients, browser,
                                                       running) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    # Given a job waiting for one that has not run (no consumer yet)
    run = running(PartsConsumer)
    wait_until(lambda: run.consumer.resources, timeout=120)
    producer = Parts(settings=settings, clients=clients)
    first = str(producer.push({"n": 2}))  # waits at the gate
    producer.status.flush()
    held = str(producer.push("report", depends_on=[first]))
    with served(settings, clients) as dash:
        # When its page is opened, then it says what it waits for
        browser.get(f"{dash.url}/job?id={held}")
        waiting = browser.find_element(By.ID, "job-waiting")
        assert waiting.get_attribute("data-state") == "HELD"
        assert "0 of 1 final" in waiting.text
        (row,) = browser.find_elements(By.CSS_SELECTOR, "#job-dependencies tbody tr")
        assert row.get_attribute("data-outcome") == "pending"
        # And the job it waits for names it
        browser.get(f"{dash.url}/job?id={first}")
        assert [li.get_attribute("data-job") for li in browser.find_elements(
            By.CSS_SELECTOR, "#job-dependents li")] == [held]
        # And an unknown group is a 404 naming it
        browser.get(f"{dash.url}/groups/no-such-group")
        assert "no group 'no-such-group'" in browser.page_source
