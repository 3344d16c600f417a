"""The dashboard's channel page shows each flow-control limit (where it comes from), the current
rate and the jobs waiting; an operator changes a limit (confirmed, audited, what consumers read
at once); a viewer sees them and is refused (HTTP against the local endpoint, deployed mode)."""

from __future__ import annotations

import html
import time

import pytest

from messenger import ChannelSpec
from messenger.channel import Rate
from messenger.jobs.limits import LimitStore
from messenger.operations.audit import AuditTrail
from messenger.provision import Provisioner
from tests.dashboard import ALB_ARN, CLIENT_ID, alb_key_server, served
from tests.integration.test_dashboard_controls import OPERATOR, VIEWER, session_of

pytest.importorskip("jwt", reason="the dashboard extra is not installed")

from messenger.tools.dashboard.auth import AlbIdentity  # noqa: E402


@pytest.fixture
def dash(settings, clients):
    """'orders' declaring 50/s and 2/s per tenant, one consumer process reporting 12.5 jobs/s
    and 3 jobs waiting on a limit; the dashboard deployed (signed identities)."""
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        "orders", namespace=settings.namespace, rate_limit="50/s", tenant_rate_limit="2/s"))
    store = LimitStore(clients, settings)
    store.ensure()
    # stamped an hour ahead: fresh (REPORT_FRESH_SECONDS) however slowly the test runs
    LimitStore(clients, settings, clock=lambda: time.time() + 3600).report(
        "orders", "task-1", 12.5, 3)
    with alb_key_server() as signer:
        identity = AlbIdentity("eu-west-1", ALB_ARN, CLIENT_ID, frozenset({"ops"}),
                               groups_claim="custom:groups", key_url=signer.key_url)
        with served(settings, clients, identity=identity) as served_dash:
            yield served_dash, signer, store


def test_the_channel_page_shows_each_limit_the_rate_and_the_jobs_waiting(dash):
    served_dash, signer, _ = dash
    viewer, _, page = session_of(served_dash, signer, VIEWER)
    assert page.status_code == 200
    text = page.text
    assert '<tr data-limit="rate_limit"><td>rate_limit</td><td class="n" data-field="value">' \
           '50/s</td>' in text
    assert '<tr data-limit="max_concurrency"><td>max_concurrency</td><td class="n" ' \
           'data-field="value">none</td>' in text
    assert '<span data-field="rate">12.5</span>' in text
    assert '<span data-field="waiting">3</span>' in text
    # A viewer gets no form; the live part refreshes the same
    assert 'id="limits-form"' not in text
    fragment = viewer.get(served_dash.url + "/fragment/channels/orders/limits", timeout=30)
    assert fragment.status_code == 200 and 'data-field="waiting">3<' in fragment.text


def test_an_operator_changes_a_limit_confirmed_and_audited(dash, settings, clients):
    served_dash, signer, store = dash
    operator, token, page = session_of(served_dash, signer, OPERATOR)
    assert 'id="limits-form"' in page.text
    url = served_dash.url + "/channels/orders/limits"
    # When the operator asks for 10/s and at most 4 at once, Then a confirmation first
    asked = operator.post(url, timeout=30, data={
        "token": token, "rate_limit": "10/s", "max_concurrency": "4", "tenant_rate_limit": ""})
    assert asked.status_code == 200 and 'id="confirm"' in asked.text
    assert "rate_limit: 50/s → 10/s" in asked.text and "max_concurrency: none → 4" in asked.text
    assert store.get("orders").rate_limit == Rate(50, 1, "s")  # nothing changed yet
    done = operator.post(url, timeout=30, data={
        "token": token, "confirmed": "yes", "rate_limit": "10/s", "max_concurrency": "4"})
    assert done.status_code == 200, done.text
    # Then consumers read the new limits, the page says who changed them
    limits = store.get("orders")
    assert limits.rate_limit == Rate(10, 1, "s") and limits.max_concurrency == 4
    assert limits.tenant_rate_limit == Rate(2, 1, "s")
    page = operator.get(served_dash.url + "/channels/orders", timeout=30).text
    assert 'data-field="value">10/s</td>\n<td>set at run time</td>' in page
    assert "last change by ada@example.com" in page
    # And the audit trail holds it, with the changes as targets
    (entry,) = [e for e in AuditTrail(clients, settings).recent() if e.action == "limits"]
    assert (entry.channel, entry.result, entry.actor) == ("orders", "done", "ada@example.com")
    assert set(entry.targets) == {"rate_limit=10/s", "max_concurrency=4"}
    # When it clears the rate limit, Then the declaration holds again
    operator.post(url, timeout=30, data={"token": token, "confirmed": "yes",
                                         "clear": "rate_limit"})
    assert store.get("orders").rate_limit == Rate(50, 1, "s")


def test_a_bad_value_is_400_naming_the_field_and_changes_nothing(dash):
    served_dash, signer, store = dash
    operator, token, _ = session_of(served_dash, signer, OPERATOR)
    for field, value, said in (("rate_limit", "fast", "rate_limit must be 'N/s'"),
                               ("max_concurrency", "0", "max_concurrency must be a whole "
                                                        "number from 1 to 10000")):
        refused = operator.post(served_dash.url + "/channels/orders/limits", timeout=30,
                                data={"token": token, "confirmed": "yes", field: value})
        assert refused.status_code == 400 and said in html.unescape(refused.text), refused.text
    assert store.show("orders").overrides == {}


def test_a_viewer_may_not_change_a_limit_and_the_attempt_is_audited(dash, settings, clients):
    served_dash, signer, store = dash
    viewer, token, _ = session_of(served_dash, signer, VIEWER)
    refused = viewer.post(served_dash.url + "/channels/orders/limits", timeout=30,
                          data={"token": token, "confirmed": "yes", "rate_limit": "1/s"})
    assert refused.status_code == 403 and "only operators may act" in refused.text
    assert store.show("orders").overrides == {}
    (entry,) = [e for e in AuditTrail(clients, settings).recent() if e.action == "limits"]
    assert entry.result == "refused" and entry.actor == "bob@example.com"


def test_a_channel_declaring_no_limit_offers_no_form_and_refuses_a_change(
        dash, settings, clients):
    served_dash, signer, store = dash
    Provisioner(clients, settings).ensure_channel(ChannelSpec("mail",
                                                              namespace=settings.namespace))
    operator, token, _ = session_of(served_dash, signer, OPERATOR)
    page = operator.get(served_dash.url + "/channels/mail", timeout=30).text
    assert 'id="limits-form"' not in page and 'id="limits-undeclared"' in page
    refused = operator.post(served_dash.url + "/channels/mail/limits", timeout=30,
                            data={"token": token, "confirmed": "yes", "max_concurrency": "3"})
    assert refused.status_code == 400
    assert "declares no limit" in html.unescape(refused.text)
    assert store.show("mail").overrides == {}
