"""The deployed dashboard's login, without AWS: identity headers signed here as an ALB signs
them (ES256, padded base64url, kid/signer/client in the header), their public key served by a
local key endpoint. A missing, expired, wrongly signed, other-ALB or other-client header is a 401
and nothing is served; a viewer reads but gets 403 on every action; an operator's action is
recorded in the job's status timeline with who did it, and shown on the job's page."""

from __future__ import annotations

import re

import pytest
import requests

from messenger import Message
from messenger.jobs.status import StatusEvent, StatusStore
from messenger.operations.deadletters import DeadLetterWorkbench
from tests.dashboard import ALB_ARN, CLIENT_ID, alb_key_server, served
from tests.integration.test_dlq_workbench import channel, dead_letter

pytest.importorskip("jwt", reason="the dashboard extra is not installed")

from messenger.tools.dashboard.auth import AlbIdentity  # noqa: E402

OPERATOR = {"sub": "u-1", "email": "ada@example.com", "custom:groups": "readers,ops"}
VIEWER = {"sub": "u-2", "email": "bob@example.com", "custom:groups": "readers"}


@pytest.fixture
def signer():
    with alb_key_server() as keys:
        yield keys


@pytest.fixture
def deployed(settings, clients, signer):
    # Given channel 'orders' tracking status, with dead letters job-0 .. job-2
    resources = channel(settings, clients)
    StatusStore(clients, settings).ensure_table()
    for n in range(3):
        dead_letter(clients.client("sqs"), resources.dlq.url,
                    Message({"n": n}, message_id=f"job-{n}"))
    identity = AlbIdentity("eu-west-1", ALB_ARN, CLIENT_ID, frozenset({"ops"}),
                           groups_claim="custom:groups", key_url=signer.key_url)
    with served(settings, clients, identity=identity) as dash:
        yield dash


def ids(settings, clients):
    return sorted(x.id for x in DeadLetterWorkbench("orders", settings, clients).list().letters)


def get(dash, path, token=None):
    headers = {"x-amzn-oidc-data": token} if token else {}
    return requests.get(dash.url + path, headers=headers, timeout=30)


def test_no_or_a_bad_identity_header_is_refused_and_nothing_is_served(deployed, signer):
    from cryptography.hazmat.primitives.asymmetric import ec

    other_key = ec.generate_private_key(ec.SECP256R1())
    bad = {
        "none": None,
        "garbage": "not.a.jwt",
        "expired": signer.token(OPERATOR, expires_in=-120),
        "wrongly signed": signer.token(OPERATOR, key=other_key),
        "another load balancer": signer.token(OPERATOR, signer=ALB_ARN.replace("dashboard",
                                                                               "other")),
        "another app client (audience)": signer.token(OPERATOR, client="someone-else"),
        "unknown key id": signer.token(OPERATOR, kid="0000-1111"),
        "key id with a path": signer.token(OPERATOR, kid="../../evil"),
        "HS256": signer.token(OPERATOR, alg="HS256"),
    }
    for why, token in bad.items():
        for path in ("/", "/channels/orders", "/channels/orders/letters/job-1",
                     "/fragment/channels", "/static/dashboard.css", "/job?id=job-1"):
            response = get(deployed, path, token)
            assert response.status_code == 401, (why, path)
            assert "job-1" not in response.text and "orders" not in response.text, (why, path)
            assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
        posted = requests.post(deployed.url + "/channels/orders/delete", timeout=30,
                               data={"ids": "job-1", "confirmed": "yes"},
                               headers={"x-amzn-oidc-data": token} if token else {})
        assert posted.status_code == 401, why
    # A good token still works
    assert get(deployed, "/channels/orders", signer.token(OPERATOR)).status_code == 200


def test_a_viewer_reads_everything_and_may_act_on_nothing(deployed, signer, settings, clients):
    session = requests.Session()
    session.headers["x-amzn-oidc-data"] = signer.token(VIEWER)
    page = session.get(deployed.url + "/channels/orders", timeout=30)
    assert page.status_code == 200 and "job-1" in page.text
    assert 'id="read-only"' in page.text and "Delete selected" not in page.text
    assert "bob@example.com (viewer)" in page.text
    token = session.cookies.get("__Host-messenger-csrf") or re.search(
        r'name="token" value="([^"]+)"', page.text)
    # Every action, confirmed or not, with or without the form's token: 403, nothing changed
    for action in ("requeue", "delete", "requeue-all", "explode"):
        for form in ({"ids": "job-1", "confirmed": "yes"}, {"ids": "job-1"},
                     {"ids": "job-1", "confirmed": "yes", "token": str(token)}):
            response = session.post(deployed.url + f"/channels/orders/{action}", data=form,
                                    timeout=30)
            assert response.status_code == 403, (action, form)
            assert "only operators may act" in response.text
    assert ids(settings, clients) == ["job-0", "job-1", "job-2"]


def test_an_operators_action_is_recorded_with_who_did_it(deployed, signer, settings, clients):
    session = requests.Session()
    session.headers["x-amzn-oidc-data"] = signer.token(OPERATOR)
    page = session.get(deployed.url + "/channels/orders", timeout=30)
    assert "ada@example.com (operator)" in page.text and "Delete selected" in page.text
    # The action token is the CSRF cookie's (instances of a Lambda share no process token)
    token = session.cookies.get("__Host-messenger-csrf")
    assert token and f'name="token" value="{token}"' in page.text
    # (the cookie is Secure, HttpOnly, SameSite=Strict: sent by hand over this test's plain HTTP)
    session.headers["Cookie"] = f"__Host-messenger-csrf={token}"
    workbench = DeadLetterWorkbench("orders", settings, clients)
    job1, job2 = (next(x.sqs_message_id for x in workbench.list().letters if x.id == name)
                  for name in ("job-1", "job-2"))
    # Without the token, or from another site: 403
    assert session.post(deployed.url + "/channels/orders/delete", timeout=30,
                        data={"ids": job1, "confirmed": "yes"}).status_code == 403
    assert session.post(deployed.url + "/channels/orders/delete", timeout=30,
                        data={"ids": job1, "confirmed": "yes", "token": token},
                        headers={"Origin": "https://evil.example"}).status_code == 403
    # When the operator deletes job-1 and requeues job-2
    host = deployed.url.removeprefix("http://")
    deleted = session.post(deployed.url + "/channels/orders/delete", timeout=30,
                           data={"ids": job1, "confirmed": "yes", "token": token},
                           headers={"Origin": f"https://{host}", "X-Forwarded-Proto": "https"})
    assert 'data-deleted="1"' in deleted.text
    moved = session.post(deployed.url + "/channels/orders/requeue", timeout=30,
                         data={"ids": job2, "confirmed": "yes", "token": token})
    assert 'data-moved="1"' in moved.text
    assert ids(settings, clients) == ["job-0"]
    # Then each job's timeline says what was done, by whom and when
    store = StatusStore(clients, settings)
    for job, event in (("job-1", StatusEvent.DELETED), ("job-2", StatusEvent.REQUEUED)):
        (record,) = [r for r in store.timeline(job) if r.event is event]
        assert record.actor == "ada@example.com" and record.at > 0
    # ... and the job's page shows it
    job_page = session.get(deployed.url + "/job?id=job-1", timeout=30)
    assert job_page.status_code == 200
    assert re.search(r"<td>DELETED</td>.*<td class=\"actor\">ada@example.com</td>",
                     job_page.text, re.S)
