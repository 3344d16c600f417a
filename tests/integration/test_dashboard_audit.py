"""The dashboard's audit trail over HTTP against the local endpoint, deployed mode (ALB-style
signed identities), in a namespace without a status table (issue 50 items 7-10): every operator
action (delete, requeue, requeue-all, pause, resume, cancel a running job, cancel scheduled
jobs) and every refused attempt (a viewer's 403, a cross-site 403, a missing token) is one
entry with who (sub and e-mail, marked unverified), when, what and the result; the /audit page
and `messenger audit` show them; nothing can change them from the dashboard; an action whose
entry cannot be written is not run."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import requests

from messenger import Message
from messenger.channel import status_table_name
from messenger.jobs.tables import table_exists
from messenger.operations.audit import AuditTrail
from messenger.operations.deadletters import DeadLetterWorkbench
from messenger.tools import cli
from tests.dashboard import ALB_ARN, CLIENT_ID, alb_key_server, served
from tests.integration.test_dlq_workbench import channel, dead_letter

pytest.importorskip("jwt", reason="the dashboard extra is not installed")

from messenger.tools.dashboard.auth import AlbIdentity  # noqa: E402

OPERATOR = {"sub": "u-1", "email": "ada@example.com", "email_verified": False,
            "custom:groups": "ops"}
VIEWER = {"sub": "u-2", "email": "bob@example.com", "email_verified": True,
          "custom:groups": "readers"}


@pytest.fixture
def signer():
    with alb_key_server() as keys:
        yield keys


def identity_of(signer) -> AlbIdentity:
    return AlbIdentity("eu-west-1", ALB_ARN, CLIENT_ID, frozenset({"ops"}),
                       groups_claim="custom:groups", key_url=signer.key_url)


def session_of(dash, signer, claims):
    session = requests.Session()
    session.headers["x-amzn-oidc-data"] = signer.token(claims, expires_in=900)
    session.get(dash.url + "/", timeout=30)
    token = session.cookies.get("__Host-messenger-csrf") or ""
    session.headers["Cookie"] = f"__Host-messenger-csrf={token}"
    return session, token


def sqs_ids(settings, clients, *names):
    letters = DeadLetterWorkbench("orders", settings, clients).list().letters
    return [next(x.sqs_message_id for x in letters if x.id == name) for name in names]


def test_every_action_and_every_refusal_is_in_the_audit_trail(settings, clients, signer,
                                                              capsys, monkeypatch):
    # Given channel 'orders' with dead letters job-0 .. job-3, in a namespace that keeps no
    # status (no status table)
    resources = channel(settings, clients)
    for n in range(4):
        dead_letter(clients.client("sqs"), resources.dlq.url,
                    Message({"n": n}, message_id=f"job-{n}"))
    started = time.time()
    with served(settings, clients, identity=identity_of(signer)) as dash:
        operator, token = session_of(dash, signer, OPERATOR)
        viewer, viewer_token = session_of(dash, signer, VIEWER)
        job1, job2 = sqs_ids(settings, clients, "job-1", "job-2")

        def act(session, action, token, **form):
            return session.post(dash.url + f"/channels/orders/{action}", timeout=60,
                                data={"token": token, "confirmed": "yes", **form})

        # When the operator deletes job-1, requeues job-2, pauses and resumes the channel,
        # cancels a running job and a scheduled job that does not exist, requeues the rest
        assert 'data-deleted="1"' in act(operator, "delete", token, ids=job1).text
        assert 'data-moved="1"' in act(operator, "requeue", token, ids=job2).text
        assert act(operator, "pause", token).status_code == 200
        assert act(operator, "resume", token).status_code == 200
        assert act(operator, "cancel-job", token, ids="job-9").status_code == 200
        assert act(operator, "cancel-scheduled", token, ids="nightly-7").status_code == 200
        assert 'data-moved="2"' in act(operator, "requeue-all", token).text
        # ... a viewer tries to delete, the operator is lured by another site, and a form
        # comes without the token
        assert act(viewer, "delete", viewer_token, ids=job1).status_code == 403
        assert operator.post(dash.url + "/channels/orders/delete", timeout=30,
                             data={"token": token, "confirmed": "yes", "ids": job1},
                             headers={"Origin": "https://evil.example"}).status_code == 403
        assert act(operator, "pause", "").status_code == 403
        # ... and an unconfirmed action (its confirmation page) changes and records nothing
        assert "Yes" in operator.post(dash.url + "/channels/orders/pause", timeout=30,
                                      data={"token": token}).text

        # Then the trail holds one entry each, newest first
        entries = AuditTrail(clients, settings).recent()
        assert [(e.action, e.result) for e in reversed(entries)] == [
            ("delete", "done"), ("requeue", "done"), ("pause", "done"), ("resume", "done"),
            ("cancel-job", "done"), ("cancel-scheduled", "failed"), ("requeue-all", "done"),
            ("delete", "refused"), ("delete", "refused"), ("pause", "refused")]
        delete, requeue, paused, resumed = reversed(entries[-4:])
        # ... naming who: the e-mail marked unverified, the sub, the role
        assert (delete.actor, delete.sub, delete.email, delete.email_verified, delete.role) == (
            "ada@example.com (unverified)", "u-1", "ada@example.com", False, "operator")
        assert delete.targets == (job1,) and delete.channel == "orders"
        assert started <= delete.at <= time.time()
        assert "deleted 1 of 1" in delete.detail and "moved 1" in requeue.detail
        # ... and the resume keeps whose pause it ended (pause then resume leaves a trace)
        assert "paused by ada@example.com (unverified)" in paused.detail
        # (read from the queue's tag, which holds no parentheses: SQS refuses them there)
        assert "resumed (was paused by ada@example.com unverified at" in resumed.detail
        by_viewer, cross_site, no_token = entries[2], entries[1], entries[0]
        assert (by_viewer.actor, by_viewer.sub, by_viewer.role, by_viewer.targets) == (
            "bob@example.com", "u-2", "viewer", (job1,))
        assert "only operators may act" in by_viewer.detail
        assert "another site ('https://evil.example')" in cross_site.detail
        assert cross_site.sub == "u-1"
        assert "action token" in no_token.detail
        # ... though the namespace has no status table
        assert not table_exists(clients, status_table_name(settings.namespace))

        # And the audit page shows them to anyone signed in, with who and the result
        page = viewer.get(dash.url + "/audit", timeout=30)
        assert page.status_code == 200
        assert page.text.count("<tr data-action=") == 10
        assert 'data-action="resume" data-result="done"' in page.text
        assert "ada@example.com (unverified)" in page.text and "u-1" in page.text
        narrowed = viewer.get(dash.url + "/audit", params={"actor": "u-2"}, timeout=30)
        assert narrowed.text.count("<tr data-action=") == 1
        # ... and nothing can change them from here: no route writes the trail
        for method in ("post", "put", "delete", "patch"):
            response = getattr(operator, method)(dash.url + "/audit", timeout=30,
                                                 data={"token": token})
            assert response.status_code == 405, method
        assert operator.post(dash.url + "/channels/orders/audit", timeout=30, data={
            "token": token, "confirmed": "yes"}).status_code == 404
        assert len(AuditTrail(clients, settings).recent()) == 10

    # And `messenger audit` prints the same, newest first
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    assert cli.main(["audit", "--channel", "orders"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10
    assert "ada@example.com (unverified) [sub u-1] (operator)  pause orders  refused" in lines[0]
    assert "delete orders [" + job1 + "]  done: deleted 1 of 1" in lines[-1]
    assert cli.main(["audit", "--json", "--limit", "1"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["result"] == "refused"
    assert cli.main(["audit", "--days", "0"]) == 2
    assert "--days must be 1 to 400" in capsys.readouterr().err


def test_an_action_that_cannot_be_recorded_is_not_run(settings, clients, signer):
    # Given a deployed-style dashboard (provisioning=verify) whose audit table is missing
    resources = channel(settings, clients)
    dead_letter(clients.client("sqs"), resources.dlq.url, Message({"n": 1}, message_id="job-1"))
    verify = dataclasses.replace(settings, provisioning="verify")
    with served(verify, clients, identity=identity_of(signer)) as dash:
        operator, token = session_of(dash, signer, OPERATOR)
        (job1,) = sqs_ids(settings, clients, "job-1")
        # When the operator deletes job-1
        response = operator.post(dash.url + "/channels/orders/delete", timeout=30,
                                 data={"token": token, "confirmed": "yes", "ids": job1})
        # Then it is refused with 503, saying why, and the letter is still there
        assert response.status_code == 503
        assert "audit trail" in response.text and "nothing changed" in response.text
        assert sqs_ids(settings, clients, "job-1") == [job1]
