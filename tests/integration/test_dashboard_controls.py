"""The dashboard's consumer controls over HTTP against the local endpoint, deployed mode (ALB-style
signed identities): an operator pauses and resumes a channel (its queues' tag, its Lambda event
source mapping) and cancels a running job; every page names a paused channel; a viewer gets 403.
"""

from __future__ import annotations

import io
import json
import re
import zipfile

import pytest
import requests

from messenger.channel import workers_table_name
from messenger.jobs.controls import CancelRequests
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.jobs.tables import ensure_table
from tests.dashboard import ALB_ARN, CLIENT_ID, alb_key_server, served
from tests.integration.test_dlq_workbench import channel

pytest.importorskip("jwt", reason="the dashboard extra is not installed")

from messenger.tools.dashboard.auth import AlbIdentity  # noqa: E402

OPERATOR = {"sub": "u-1", "email": "ada@example.com", "custom:groups": "ops"}
VIEWER = {"sub": "u-2", "email": "bob@example.com", "custom:groups": "readers"}


@pytest.fixture
def signer():
    with alb_key_server() as keys:
        yield keys


def lambda_consumer(clients, queue_arn: str) -> str:
    """A Lambda function reading the queue through an event source mapping: its UUID."""
    role = clients.client("iam").create_role(
        RoleName="consumer", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17",
                                                                  "Statement": []}))
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("handler.py", "def handler(event, context):\n    return {}\n")
    awslambda = clients.client("lambda")
    awslambda.create_function(FunctionName="orders-consumer", Runtime="python3.11",
                              Role=role["Role"]["Arn"], Handler="handler.handler",
                              Code={"ZipFile": archive.getvalue()})
    return str(awslambda.create_event_source_mapping(
        EventSourceArn=queue_arn, FunctionName="orders-consumer", BatchSize=10)["UUID"])


def session_of(dash, signer, claims):
    session = requests.Session()
    session.headers["x-amzn-oidc-data"] = signer.token(claims)
    page = session.get(dash.url + "/channels/orders", timeout=30)
    token = session.cookies.get("__Host-messenger-csrf") or ""
    session.headers["Cookie"] = f"__Host-messenger-csrf={token}"
    return session, token, page


def test_an_operator_pauses_and_resumes_a_channel_and_every_page_says_so(
        settings, clients, signer):
    # Given channel 'orders' with a Lambda consumer (event source mapping) and a tracked job
    resources = channel(settings, clients)
    mapping = lambda_consumer(clients, resources.queue.arn)
    identity = AlbIdentity("eu-west-1", ALB_ARN, CLIENT_ID, frozenset({"ops"}),
                           groups_claim="custom:groups", key_url=signer.key_url)
    with served(settings, clients, identity=identity) as dash:
        operator, token, page = session_of(dash, signer, OPERATOR)
        assert 'id="pause"' in page.text and "data-paused=" not in page.text
        viewer, viewer_token, viewer_page = session_of(dash, signer, VIEWER)
        assert 'id="pause"' not in viewer_page.text
        # A viewer may not pause, resume or cancel
        for action in ("pause", "resume", "cancel-job"):
            refused = viewer.post(dash.url + f"/channels/orders/{action}", timeout=30, data={
                "token": viewer_token, "confirmed": "yes", "ids": "job-1"})
            assert refused.status_code == 403 and "only operators may act" in refused.text
        # When the operator pauses it (after the confirmation)
        asked = operator.post(dash.url + "/channels/orders/pause", timeout=30,
                              data={"token": token})
        assert 'id="confirm"' in asked.text and "Pause the consumers of orders" in asked.text
        done = operator.post(dash.url + "/channels/orders/pause", timeout=30,
                             data={"token": token, "confirmed": "yes"})
        assert done.status_code == 200 and "1 Lambda event source mapping(s) disabled" in done.text
        # Then the queue carries who paused it, the Lambda mapping is disabled
        sqs = clients.client("sqs")
        tags = sqs.list_queue_tags(QueueUrl=resources.queue.url)["Tags"]
        assert re.fullmatch(r"ada@example\.com@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                            tags["messenger:paused"])
        described = clients.client("lambda").get_event_source_mapping(UUID=mapping)
        assert described["State"] in ("Disabled", "Disabling")
        # and every page says so, with who
        for path in ("/", "/channels/orders", "/search", "/channels/orders/history",
                     "/channels/orders/scheduled"):
            shown = viewer.get(dash.url + path, timeout=30)
            assert shown.status_code == 200, path
            assert re.search(r'data-paused="orders">.*paused by ada@example\.com at ',
                             shown.text), path
        assert 'data-field="paused"' in viewer.get(dash.url + "/fragment/channels",
                                                   timeout=30).text
        page = operator.get(dash.url + "/channels/orders", timeout=30)
        assert 'id="resume"' in page.text
        # When resumed, the tag is gone and the mapping enabled
        resumed = operator.post(dash.url + "/channels/orders/resume", timeout=30,
                                data={"token": token, "confirmed": "yes"})
        assert "resumed" in resumed.text
        assert "messenger:paused" not in (
            sqs.list_queue_tags(QueueUrl=resources.queue.url).get("Tags") or {})
        described = clients.client("lambda").get_event_source_mapping(UUID=mapping)
        assert described["State"] in ("Enabled", "Enabling")
        assert "data-paused=" not in viewer.get(dash.url + "/", timeout=30).text


def test_an_operator_cancels_a_running_job_from_its_page(settings, clients, signer):
    # Given a tracked job whose consumer started it
    channel(settings, clients)
    store = StatusStore(clients, settings)
    store.ensure_table()
    for event in (StatusEvent.RECEIVED, StatusEvent.STARTED):
        store.record(StatusRecord("job-7", event, "orders", consumer_id="c-1"))
    store.close()
    ensure_table(clients, settings, workers_table_name(settings.namespace), "worker registry",
                 "channel", "worker_id")
    identity = AlbIdentity("eu-west-1", ALB_ARN, CLIENT_ID, frozenset({"ops"}),
                           groups_claim="custom:groups", key_url=signer.key_url)
    with served(settings, clients, identity=identity) as dash:
        operator, token, _ = session_of(dash, signer, OPERATOR)
        viewer, _, _ = session_of(dash, signer, VIEWER)
        assert 'id="cancel-job"' not in viewer.get(dash.url + "/job?id=job-7", timeout=30).text
        job_page = operator.get(dash.url + "/job?id=job-7", timeout=30)
        assert 'id="cancel-job"' in job_page.text
        # When the operator cancels it (after the confirmation)
        asked = operator.post(dash.url + "/channels/orders/cancel-job", timeout=30,
                              data={"token": token, "ids": "job-7"})
        assert "cancelled by ada@example.com" in asked.text
        # (beside "Yes, cancel", the way back says it keeps the job running)
        assert '<a href="/job?id=job-7" id="cancel">No, let it run</a>' in asked.text
        done = operator.post(dash.url + "/channels/orders/cancel-job", timeout=30,
                             data={"token": token, "ids": "job-7", "confirmed": "yes"})
        assert "cancel of job-7 requested by ada@example.com" in done.text
    # Then the request waits for the consumer running it, naming who asked
    (request,) = CancelRequests(clients, settings, "orders").pending().values()
    assert (request.message_id, request.by) == ("job-7", "ada@example.com")
