"""`HttpEnqueue` (stacks/http_enqueue.py): one in-process synth per session of two small stacks,
the default API and one with every option, cdk-nag on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cognito as cognito
from aws_cdk.assertions import Match
from cdk_nag import AwsSolutionsChecks

from messenger.api.channels import ApiChannel, parse_channels
from messenger.api.requests import MAX_DELAY_SECONDS
from messenger.channel import TAG_CHANNEL, ChannelSpec
from stacks.channel import Channel
from stacks.foundation import Foundation
from stacks.http_enqueue import ROUTES, HttpEnqueue
from stacks.ownership import ownership_condition
from stacks.schedules import ScheduleWiring
from tests.infra.conftest import ACCOUNT, REGION, as_list
from tests.infra.synthesized import Synthesized, synthesize
from tests.infra.tag_conditions import tags_meet

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
NAMESPACE = "http"
#: A namespace per stack: one app deploys a channel name once per namespace.
NAMESPACES = {"Default": NAMESPACE, "Options": "httpo", "Bad": "httpb"}


def _stack(app: cdk.App, name: str, exchange: bool = True
           ) -> tuple[cdk.Stack, Foundation, list[Channel]]:
    """A stack with its foundation and channels: a queue with levels and status, and (an
    exchange is the app's, shared by its stacks: one stack has it) an exchange's two queues,
    which track status."""
    stack = cdk.Stack(app, name, env=cdk.Environment(account=ACCOUNT, region=REGION))
    namespace = NAMESPACES[name]
    foundation = Foundation(stack, "Foundation", namespace=namespace)
    specs = [ChannelSpec("orders", namespace=namespace, track_status=True,
                         priorities=("high", "low")),
             ChannelSpec("events.mobile", namespace=namespace, track_status=True),
             ChannelSpec("events.web", namespace=namespace, track_status=True)][
                 : 3 if exchange else 1]
    channels = [Channel(stack, f"Channel{i}", spec=spec, key=foundation.key)
                for i, spec in enumerate(specs)]
    return stack, foundation, channels


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    outdir = tmp_path_factory.mktemp("http-enqueue")
    app = cdk.App(outdir=str(outdir), context=CONTEXT, builtin_cloud_formation_validation=False)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    stack, foundation, channels = _stack(app, "Default")
    schedules = ScheduleWiring(stack, "Schedules", namespace=NAMESPACE, key=foundation.key)
    HttpEnqueue(stack, "Jobs", channels=channels, foundation=foundation, namespace=NAMESPACE,
                schedules=schedules)
    stack, foundation, channels = _stack(app, "Options", exchange=False)
    pool = cognito.UserPool.from_user_pool_arn(  # the team's own pool, deployed elsewhere
        stack, "Pool", f"arn:aws:cognito-idp:{REGION}:{ACCOUNT}:userpool/{REGION}_Example")
    HttpEnqueue(stack, "Jobs", channels=channels, foundation=foundation,
                namespace=NAMESPACES["Options"], cognito_user_pools=[pool],
                unauthenticated=["GET /jobs/{id}"],
                usage_plan=apigw.ThrottleSettings(rate_limit=5, burst_limit=10),
                web_acl_arn="arn:aws:wafv2:eu-west-1:123456789012:regional/webacl/x/1")
    return synthesize(app, outdir)


def _function(synthesized: Synthesized, stack: str) -> tuple[str, dict[str, Any]]:
    (found,) = [(k, r) for k, r in synthesized.of_type(stack, "AWS::Lambda::Function").items()
                if r["Properties"].get("Handler") == "lambdas.http_enqueue.handler.handler"]
    return found


def _role_statements(synthesized: Synthesized, stack: str) -> list[dict[str, Any]]:
    _, function = _function(synthesized, stack)
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    (policy,) = [r for r in synthesized.of_type(stack, "AWS::IAM::Policy").values()
                 if {"Ref": role} in r["Properties"]["Roles"]]
    return list(policy["Properties"]["PolicyDocument"]["Statement"])


def test_both_stacks_synthesize_cdk_nag_clean(synthesized: Synthesized) -> None:
    assert synthesized.violations == []
    assert set(synthesized.templates) == {"Default", "Options"}


def test_every_method_is_iam_authorized_by_default(synthesized: Synthesized) -> None:
    methods = synthesized.of_type("Default", "AWS::ApiGateway::Method")
    assert sorted(m["Properties"]["HttpMethod"] for m in methods.values()) == \
        ["GET", "POST", "POST"]
    assert {m["Properties"]["AuthorizationType"] for m in methods.values()} == {"AWS_IAM"}
    assert not any(m["Properties"].get("ApiKeyRequired") for m in methods.values())


def test_the_api_is_regional_throttled_and_access_logged(synthesized: Synthesized) -> None:
    template = synthesized.template("Default")
    template.has_resource_properties("AWS::ApiGateway::RestApi", {
        "EndpointConfiguration": {"Types": ["REGIONAL"]}, "Name": f"{NAMESPACE}-messenger-jobs"})
    (log_group,) = [k for k in synthesized.of_type("Default", "AWS::Logs::LogGroup")
                    if "AccessLogs" in k]
    template.has_resource_properties("AWS::ApiGateway::Stage", {
        "StageName": "v1",
        "TracingEnabled": True,
        "MethodSettings": Match.array_with([Match.object_like({
            "HttpMethod": "*", "ResourcePath": "/*",
            "ThrottlingRateLimit": 50, "ThrottlingBurstLimit": 100})]),
        "AccessLogSetting": {"DestinationArn": {"Fn::GetAtt": [log_group, "Arn"]},
                             "Format": Match.string_like_regexp(r"requestId.*status")},
    })
    # And API Gateway answers its own throttling with 429 and Retry-After
    template.has_resource_properties("AWS::ApiGateway::GatewayResponse", {
        "ResponseType": "THROTTLED", "StatusCode": "429",
        "ResponseParameters": {"gatewayresponse.header.Retry-After": "'1'"}})


def test_every_answer_api_gateway_writes_itself_has_the_error_shape(
        synthesized: Synthesized) -> None:
    # Given the answers API Gateway writes without calling the function (an unknown route is its
    # 403 "Missing Authentication Token", a timeout its 504), rendered as API Gateway renders
    # them: $context.error.messageString is the quoted message, validationErrorString unquoted
    responses = {r["Properties"]["ResponseType"]: r["Properties"] for r in
                 synthesized.of_type("Default", "AWS::ApiGateway::GatewayResponse").values()}
    assert {"DEFAULT_4XX", "DEFAULT_5XX", "BAD_REQUEST_BODY", "THROTTLED",
            "REQUEST_TOO_LARGE"} <= set(responses)
    for kind, response in responses.items():
        template = response["ResponseTemplates"]["application/json"]
        rendered = (template.replace("$context.error.messageString",
                                     json.dumps("Missing Authentication Token"))
                    .replace("$context.error.validationErrorString", "Invalid request body"))
        # Then each is one JSON object with an "error" line, as the function's own errors are
        assert set(json.loads(rendered)) == {"error"}, kind
        assert json.loads(rendered)["error"], kind


def test_posts_are_validated_against_the_job_models_before_the_function(
        synthesized: Synthesized) -> None:
    resources = synthesized.templates["Default"]["Resources"]
    (validator,) = synthesized.of_type("Default", "AWS::ApiGateway::RequestValidator")
    models = {r["Properties"]["Name"]: k
              for k, r in synthesized.of_type("Default", "AWS::ApiGateway::Model").items()}
    posts = [m["Properties"] for m in synthesized.of_type(
        "Default", "AWS::ApiGateway::Method").values() if m["Properties"]["HttpMethod"] == "POST"]
    assert sorted(p["RequestModels"]["application/json"]["Ref"] for p in posts) == \
        sorted(models.values())
    assert all(p["RequestValidatorId"] == {"Ref": validator} for p in posts)
    job = resources[models["MessengerJob"]]["Properties"]["Schema"]
    assert job["required"] == ["body"] and job["additionalProperties"] is False
    assert job["properties"]["max_attempts"] == {"type": "integer", "minimum": 1,
                                                 "maximum": 1000}
    batch = resources[models["MessengerJobBatch"]]["Properties"]["Schema"]
    assert batch["properties"]["jobs"]["maxItems"] == 10


def test_the_function_serves_its_channels_as_the_library_reads_them(
        synthesized: Synthesized) -> None:
    _, function = _function(synthesized, "Default")
    environment = function["Properties"]["Environment"]["Variables"]
    # The construct's JSON is what messenger.api parses: the queue, and the exchange once
    assert parse_channels(environment["MESSENGER_API_CHANNELS"]) == {
        "orders": ApiChannel("orders", priorities=("high", "low"), track_status=True),
        "events": ApiChannel("events", exchange=True, track_status=True),
    }
    assert environment["MESSENGER_PROVISIONING"] == "verify"
    assert environment["MESSENGER_NAMESPACE"] == NAMESPACE
    # It answers before API Gateway's 29 s, its retries well inside that
    assert function["Properties"]["Timeout"] < 29
    assert float(environment["MESSENGER_RETRY_BUDGET"]) * 2 < function["Properties"]["Timeout"]


def _arn_refs(resource: Any) -> str:
    return json.dumps(resource)


def test_the_function_may_send_to_its_channels_and_nothing_else(
        synthesized: Synthesized) -> None:
    statements = _role_statements(synthesized, "Default")
    by_action: dict[str, list[str]] = {}
    for statement in statements:
        assert statement["Effect"] == "Allow"
        for action in as_list(statement["Action"]):
            by_action.setdefault(action, []).extend(
                _arn_refs(r) for r in as_list(statement["Resource"]))
    resources = synthesized.templates["Default"]["Resources"]
    # The orders levels' queues (the exchange's queues are fed by its topic, not by the API)
    queues = {k for k, r in resources.items() if r["Type"] == "AWS::SQS::Queue"
              and "orders" in r["Properties"]["QueueName"]
              and not r["Properties"]["QueueName"].endswith("-dlq")}
    assert len(queues) == 2
    topics = {k for k, r in resources.items() if r["Type"] == "AWS::SNS::Topic"}
    # (scheduler and iam: one-time schedules, `test_the_function_may_schedule_jobs_...`)
    assert {action.split(":")[0] for action in by_action} == {
        "sqs", "sns", "kms", "s3", "dynamodb", "logs", "xray", "scheduler", "iam"}
    # Send: exactly the orders levels' queues (never a DLQ), publish: the exchange's topic
    assert sorted(by_action["sqs:SendMessage"]) == sorted(
        json.dumps({"Fn::GetAtt": [q, "Arn"]}) for q in queues)
    assert not {a for a in by_action if a.startswith("sqs:")} - {
        "sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:ListQueueTags"}
    assert by_action["sns:Publish"] == [json.dumps({"Ref": t}) for t in topics]
    # The key, the payload objects, the job tables; * only for X-Ray (no resource types)
    key = json.dumps({"Fn::GetAtt": [next(k for k in resources if "FoundationKey" in k
                                          and resources[k]["Type"] == "AWS::KMS::Key"), "Arn"]})
    assert set(by_action["kms:GenerateDataKey"]) == {key}
    assert all("/payloads/*" in r for r in by_action["s3:PutObject"])
    # (GET /jobs/{id}: a result too large for its item is an offloaded object)
    assert all("/payloads/*" in r for r in by_action["s3:GetObject"])
    assert "s3:DeleteObject" not in by_action
    tables = {name: json.dumps({"Fn::GetAtt": [k, "Arn"]}) for name in
              ("Dedup", "Idempotency", "Status") for k in resources
              if k.startswith(f"Foundation{name}Table")}
    assert tables["Dedup"] in by_action["dynamodb:PutItem"]
    assert tables["Idempotency"] in by_action["dynamodb:UpdateItem"]
    assert by_action["dynamodb:Query"] == [tables["Status"]]
    assert "dynamodb:Scan" not in by_action
    wildcard = {a for a, refs in by_action.items() if '"*"' in refs}
    assert wildcard == {"xray:PutTraceSegments", "xray:PutTelemetryRecords",
                        "scheduler:ListSchedules"}


def test_the_function_reads_the_tracking_declarations_of_its_channels_only(
        synthesized: Synthesized) -> None:
    # A producer's first push and GET /jobs/{id} read the channel's messenger:track-status tag
    # (sqs:ListQueueTags; without it the answer falls back to the API's configuration)
    statements = _role_statements(synthesized, "Default")
    resources = synthesized.templates["Default"]["Resources"]
    orders = sorted(json.dumps({"Fn::GetAtt": [k, "Arn"]}) for k, r in resources.items()
                    if r["Type"] == "AWS::SQS::Queue" and "orders" in r["Properties"]["QueueName"]
                    and not r["Properties"]["QueueName"].endswith("-dlq"))
    by_arn = [s for s in statements if "sqs:ListQueueTags" in as_list(s["Action"])
              and "Condition" not in s]
    assert sorted(json.dumps(r) for s in by_arn for r in as_list(s["Resource"])) == orders
    # The tracked exchange's answer reads every queue subscribed to its topic: the topic's
    # subscriptions (its ARN) ...
    (topic,) = synthesized.of_type("Default", "AWS::SNS::Topic")
    (listing,) = [s for s in statements
                  if "sns:ListSubscriptionsByTopic" in as_list(s["Action"])]
    assert listing["Resource"] == {"Ref": topic}
    # ... and the queues of that exchange in the namespace, made at deploy or at run time
    # (their tags: the API cannot name a queue a consumer subscribes at run time)
    (by_tags,) = [s for s in statements if "sqs:ListQueueTags" in as_list(s["Action"])
                  and "Condition" in s]
    assert sorted(as_list(by_tags["Action"])) == ["sqs:GetQueueUrl", "sqs:ListQueueTags"]
    assert by_tags["Resource"] == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"}, f":sqs:{REGION}:{ACCOUNT}:*"]]}
    condition = by_tags["Condition"]
    assert condition == {**ownership_condition(NAMESPACE, "queue"), "StringLike": {
        f"aws:ResourceTag/{TAG_CHANNEL}": "events.*"}}
    # Which queues it reaches, by the tags the channels' queues carry
    def reached(spec: ChannelSpec, role: str = "queue") -> bool:
        return tags_meet(condition, spec.resource_tags(role))
    assert reached(ChannelSpec("events.mobile", namespace=NAMESPACE))
    assert reached(ChannelSpec("events.audit", namespace=NAMESPACE))  # a run-time subscriber
    assert all(reached(level) for level in ChannelSpec(
        "events.bulk", namespace=NAMESPACE, priorities=("high", "low")).level_specs())
    assert not reached(ChannelSpec("events.mobile", namespace=NAMESPACE), "dlq")
    assert not reached(ChannelSpec("orders", namespace=NAMESPACE))
    assert not reached(ChannelSpec("eventsx.mobile", namespace=NAMESPACE))
    assert not reached(ChannelSpec("events.mobile", namespace=f"{NAMESPACE}-eu"))
    assert not reached(ChannelSpec("events.mobile"))  # the default namespace's
    # The Options API serves no exchange: no subscriptions, no tag-conditioned read
    options = json.dumps(_role_statements(synthesized, "Options"))
    assert "ListSubscriptionsByTopic" not in options and "aws:ResourceTag" not in options
    assert "sqs:ListQueueTags" in options


def test_the_function_may_schedule_jobs_in_its_namespace_group_only(
        synthesized: Synthesized) -> None:
    # Given the API built with the namespace's schedule wiring (jobs with at / delay_seconds)
    _, function = _function(synthesized, "Default")
    resources = synthesized.templates["Default"]["Resources"]
    role = resources[function["Properties"]["Role"]["Fn::GetAtt"][0]]
    # Then its role carries no managed policy (the namespace producers' passes the namespace's
    # scheduler role, which reaches every channel of the namespace) ...
    assert "ManagedPolicyArns" not in role["Properties"]
    statements = _role_statements(synthesized, "Default")
    # ... CreateSchedule on the namespace's group only
    (create,) = [s for s in statements if "scheduler:CreateSchedule" in as_list(s["Action"])]
    assert create["Resource"] == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"}, ":scheduler:", {"Ref": "AWS::Region"}, ":",
        {"Ref": "AWS::AccountId"}, f":schedule/{NAMESPACE}-messenger/*"]]}
    # ... PassRole of the API's own scheduler role only, and only to Scheduler
    (passing,) = [s for s in statements if s["Action"] == "iam:PassRole"]
    assert passing["Condition"] == {
        "StringEquals": {"iam:PassedToService": "scheduler.amazonaws.com"}}
    scheduler_role = passing["Resource"]["Fn::GetAtt"][0]
    assert "JobsSchedulerRole" in scheduler_role
    assert "RoleName" not in resources[scheduler_role]["Properties"]
    # ... which the function's producers use (MESSENGER_SCHEDULER_ROLE_ARN)
    assert function["Properties"]["Environment"]["Variables"][
        "MESSENGER_SCHEDULER_ROLE_ARN"] == {"Fn::GetAtt": [scheduler_role, "Arn"]}
    # And that role may send to the API's channels and the schedule DLQ, nowhere else
    (policy,) = [r for r in synthesized.of_type("Default", "AWS::IAM::Policy").values()
                 if {"Ref": scheduler_role} in r["Properties"]["Roles"]]
    sending = policy["Properties"]["PolicyDocument"]["Statement"]
    sends = {a for s in sending for a in as_list(s["Action"])
             if a.startswith(("sqs:", "sns:"))}
    # (a channel's publish grant lets a producer check it too: reads of the same resources)
    assert sends - {"sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sns:GetTopicAttributes"} \
        == {"sqs:SendMessage", "sns:Publish"}
    queues = sorted(json.dumps(r) for s in sending if "sqs:SendMessage" in as_list(s["Action"])
                    for r in as_list(s["Resource"]))
    assert len(queues) == 3  # orders' two priority levels, the schedule DLQ
    assert any("SchedulesDeadLetters" in q for q in queues)
    assert sum("Channel0" in q for q in queues) == 2
    topics = [r for s in sending if "sns:Publish" in as_list(s["Action"])
              for r in as_list(s["Resource"])]
    assert topics == [{"Ref": next(k for k in synthesized.of_type("Default", "AWS::SNS::Topic"))}]
    assert "*" not in json.dumps([s["Resource"] for s in sending
                                  if not as_list(s["Action"])[0].startswith("kms:")])
    # And the Options API, built without schedules, may not create any
    options = synthesized.of_type("Options", "AWS::IAM::Role")
    assert not any("ManagedPolicyArns" in r["Properties"] for r in options.values())
    assert "scheduler:" not in json.dumps(synthesized.templates["Options"])


def test_the_request_model_takes_at_and_long_delays(synthesized: Synthesized) -> None:
    job = next(r["Properties"]["Schema"] for r in synthesized.of_type(
        "Default", "AWS::ApiGateway::Model").values() if r["Properties"]["Name"] == "MessengerJob")
    assert job["properties"]["at"]["type"] == "string"
    assert job["properties"]["delay_seconds"]["maximum"] == MAX_DELAY_SECONDS


def test_cognito_and_named_open_routes_and_a_usage_plan_when_asked(
        synthesized: Synthesized) -> None:
    methods = {m["Properties"]["HttpMethod"] + " " + m["Properties"]["AuthorizationType"]
               for m in synthesized.of_type("Options", "AWS::ApiGateway::Method").values()}
    # The named route only is open; the others use the user pool
    assert sorted(methods) == ["GET NONE", "POST COGNITO_USER_POOLS"]
    assert len(synthesized.of_type("Options", "AWS::ApiGateway::Authorizer")) == 1
    assert all(m["Properties"]["ApiKeyRequired"] for m in synthesized.of_type(
        "Options", "AWS::ApiGateway::Method").values())
    template = synthesized.template("Options")
    template.has_resource_properties("AWS::ApiGateway::UsagePlan", {
        "Throttle": {"RateLimit": 5, "BurstLimit": 10}})
    template.resource_count_is("AWS::WAFv2::WebACLAssociation", 1)
    # And an exchange-less API grants no SNS
    assert not [s for s in _role_statements(synthesized, "Options")
                if any(a.startswith("sns:") for a in as_list(s["Action"]))]


def test_an_unknown_route_to_open_fails_naming_the_routes(tmp_path: Path) -> None:
    app = cdk.App(outdir=str(tmp_path), context=CONTEXT)
    stack, foundation, channels = _stack(app, "Bad", exchange=False)
    with pytest.raises(ValueError, match="routes are") as error:
        HttpEnqueue(stack, "Jobs", channels=channels, foundation=foundation,
                    namespace=NAMESPACES["Bad"], unauthenticated=["POST /jobs"])
    assert all(route in str(error.value) for route in ROUTES)
