"""`messenger dashboard --login` (issue 50 item 18): the local stand-in for the load balancer's
sign-in, over real HTTP. Unsigned requests are sent to /local-login; a viewer signed in there
reads and is refused every action; an operator acts, named in the audit trail; an identity
header the browser sends itself is dropped (only the local signer's token reaches the app, which
verifies it as deployed, fetching the key from /local-login/keys/<kid>); a sign-in posted from
another site is refused; and the command prints where to sign in."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import requests

from messenger import Message
from messenger.operations.audit import AuditTrail
from messenger.operations.deadletters import DeadLetterWorkbench
from tests.dashboard import alb_key_server, free_port
from tests.integration.test_dlq_workbench import channel, dead_letter

pytest.importorskip("jwt", reason="the dashboard extra is not installed")

from messenger.tools.dashboard.app import Dashboard, running  # noqa: E402
from messenger.tools.dashboard.local_login import LocalLogin  # noqa: E402


def sign_in(url: str, user: str) -> tuple[requests.Session, str, str]:
    session = requests.Session()
    signed = session.post(url + "/local-login", data={"user": user}, timeout=30,
                          allow_redirects=False)
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    assert "HttpOnly" in signed.headers["set-cookie"]
    assert "SameSite=Strict" in signed.headers["set-cookie"]
    page = session.get(url + "/channels/orders", timeout=30)
    assert page.status_code == 200
    # (the CSRF cookie is Secure: sent by hand over this test's plain HTTP, with the login's)
    csrf = session.cookies.get("__Host-messenger-csrf") or ""
    session.headers["Cookie"] = (f"__Host-messenger-csrf={csrf}; messenger-local-login="
                                 f"{session.cookies.get('messenger-local-login')}")
    return session, csrf, page.text


def test_try_the_viewer_and_the_operator_locally(settings, clients):
    resources = channel(settings, clients)
    for n in range(2):
        dead_letter(clients.client("sqs"), resources.dlq.url,
                    Message({"n": n}, message_id=f"job-{n}"))
    job0 = next(x.sqs_message_id for x in DeadLetterWorkbench("orders", settings, clients)
                .list().letters if x.id == "job-0")
    port = free_port()
    login = LocalLogin(port)
    dashboard = Dashboard(settings, clients, port, identity=login.identity(), local_login=login)
    with running(dashboard) as url:
        # Not signed in: sent to the sign-in page, which offers the users
        first = requests.get(url + "/channels/orders", timeout=30, allow_redirects=False)
        assert first.status_code == 303 and first.headers["location"] == "/local-login"
        page = requests.get(url + "/local-login", timeout=30)
        assert 'id="as-viewer"' in page.text and 'id="as-operator"' in page.text
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        assert requests.post(url + "/channels/orders/delete", timeout=30,
                             data={"ids": job0, "confirmed": "yes"}).status_code == 401
        # A header the browser sends itself is dropped: still not signed in
        with alb_key_server() as other:
            forged = other.token({"sub": "x", "email": "mallory@example.com",
                                  "groups": "operators"})
        assert requests.get(url + "/", headers={"x-amzn-oidc-data": forged}, timeout=30,
                            allow_redirects=False).status_code == 303
        # A sign-in posted from another site is refused
        assert requests.post(url + "/local-login", data={"user": "operator"}, timeout=30,
                             headers={"Origin": "http://evil.example"}).status_code == 403

        # The viewer reads, has no actions, and is refused (and recorded) when trying one
        viewer, viewer_csrf, viewer_page = sign_in(url, "viewer")
        assert "viewer@example.com (viewer)" in viewer_page and 'data-letter="job-0"' \
            in viewer_page
        assert 'type="checkbox"' not in viewer_page and 'id="read-only"' in viewer_page
        refused = viewer.post(url + "/channels/orders/delete", timeout=30,
                              data={"token": viewer_csrf, "ids": job0, "confirmed": "yes"})
        assert refused.status_code == 403 and "only operators may act" in refused.text

        # The operator acts: job-0 deleted, in the audit trail with its sub
        operator, csrf, operator_page = sign_in(url, "operator")
        assert "operator@example.com (operator)" in operator_page
        assert 'id="delete-selected"' in operator_page
        deleted = operator.post(url + "/channels/orders/delete", timeout=30,
                                headers={"Origin": url},
                                data={"token": csrf, "ids": job0, "confirmed": "yes"})
        assert 'data-deleted="1"' in deleted.text
        # An operator whose provider does not vouch for the e-mail is named so
        _, _, unverified_page = sign_in(url, "unverified-operator")
        assert "new-operator@example.com (unverified) (operator)" in unverified_page
        # Signing out ends it
        operator.headers.pop("Cookie")
        assert operator.post(url + "/local-login", data={"user": "sign-out"}, timeout=30,
                             allow_redirects=False).headers["set-cookie"].startswith(
            "messenger-local-login=;")
        assert requests.post(url + "/local-login", data={"user": "root"},
                             timeout=30).status_code == 400

    entries = AuditTrail(clients, settings).recent()
    assert [(e.action, e.result, e.sub, e.actor) for e in reversed(entries)] == [
        ("delete", "refused", "local-viewer-1", "viewer@example.com"),
        ("delete", "done", "local-operator-1", "operator@example.com")]
    assert [x.id for x in DeadLetterWorkbench("orders", settings, clients).list().letters] \
        == ["job-1"]


def test_the_command_says_where_to_sign_in(settings):
    port = free_port()
    env = {**os.environ, "MESSENGER_NAMESPACE": settings.namespace}
    process = subprocess.Popen(
        [sys.executable, "-m", "messenger.tools.cli", "dashboard", "--login", "--port",
         str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(2)]
        assert re.search(rf"sign in as a viewer or an operator at "
                         rf"http://127\.0\.0\.1:{port}/local-login", lines[1]), lines
    finally:
        process.terminate()
        process.wait(timeout=30)
