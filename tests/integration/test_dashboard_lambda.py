"""The deployed dashboard as its Lambda runs it: ALB events through mangum into the same app
(`messenger.tools.dashboard.deployed`), against the local endpoint, with identity headers signed
here as the load balancer signs them."""

from __future__ import annotations

import pytest

from messenger import Message
from tests.dashboard import ALB_ARN, CLIENT_ID, alb_key_server
from tests.integration.test_dlq_workbench import channel, dead_letter

pytest.importorskip("mangum", reason="the dashboard-lambda extra is not installed")

from mangum import Mangum  # noqa: E402

from messenger.errors import InvalidSettings  # noqa: E402
from messenger.tools.dashboard.deployed import DeployedSettings, deployed_app  # noqa: E402


class Context:
    function_name = "dashboard"
    aws_request_id = "req-1"
    invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:dashboard"
    memory_limit_in_mb = 1024


def alb_event(path: str, headers: dict[str, str], method: str = "GET") -> dict:
    return {
        "requestContext": {"elb": {"targetGroupArn": "arn:aws:elasticloadbalancing:eu-west-1:"
                                                     "123456789012:targetgroup/d/1"}},
        "httpMethod": method, "path": path, "queryStringParameters": {},
        "headers": {"host": "dash.example.com", "x-forwarded-proto": "https",
                    "x-forwarded-port": "443", **headers},
        "body": "", "isBase64Encoded": False,
    }


def test_alb_events_are_served_only_with_a_valid_signed_header(settings, clients, monkeypatch):
    resources = channel(settings, clients)
    dead_letter(clients.client("sqs"), resources.dlq.url, Message({"n": 1}, message_id="job-1"))
    env = {"MESSENGER_DASHBOARD_ALB_ARN": ALB_ARN, "MESSENGER_DASHBOARD_CLIENT_ID": CLIENT_ID,
           "AWS_REGION": "eu-west-1", "MESSENGER_DASHBOARD_OPERATOR_GROUPS": "ops",
           "MESSENGER_DASHBOARD_GROUPS_CLAIM": "groups"}
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    with alb_key_server() as signer:
        handler = Mangum(deployed_app(env, key_url=signer.key_url), lifespan="off")
        refused = handler(alb_event("/channels/orders", {}), Context())
        assert refused["statusCode"] == 401 and "job-1" not in refused["body"]
        assert "frame-ancestors 'none'" in refused["headers"]["content-security-policy"]
        token = signer.token({"sub": "u-9", "email": "eve@example.com", "groups": ["ops"]})
        page = handler(alb_event("/channels/orders", {"x-amzn-oidc-data": token}), Context())
        assert page["statusCode"] == 200
        assert "job-1" in page["body"] and "eve@example.com (operator)" in page["body"]
        assert "__Host-messenger-csrf=" in page["headers"]["set-cookie"]


def test_settings_name_what_is_missing():
    with pytest.raises(InvalidSettings, match="MESSENGER_DASHBOARD_ALB_ARN"):
        DeployedSettings.from_env({"AWS_REGION": "eu-west-1"})
    parsed = DeployedSettings.from_env({
        "MESSENGER_DASHBOARD_ALB_ARN": ALB_ARN, "MESSENGER_DASHBOARD_CLIENT_ID": "c",
        "AWS_REGION": "eu-west-1", "MESSENGER_DASHBOARD_OPERATOR_GROUPS": " ops, admins ,"})
    assert parsed.operator_groups == {"ops", "admins"}
    assert parsed.groups_claim == "cognito:groups"
