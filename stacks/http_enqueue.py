"""`HttpEnqueue`: an API Gateway REST API whose methods put jobs on channels (issue 41).

```python
api = stack.add_http_enqueue([orders, receipts])          # IAM (SigV4) on every method
api = stack.add_http_enqueue([orders], cognito_user_pools=[pool])  # a Cognito authorizer instead
```

    POST /channels/{channel}/jobs         one job (202 + job id + Location)
    POST /channels/{channel}/jobs/batch   up to 10 jobs, a result per job
    GET  /jobs/{id}                       a job's status timeline

The methods run one Lambda function, `lambdas/http_enqueue` (`messenger.api.app.JobApi`: the
channels' own `Producer`s), which may send to the API's channels and nothing else: their queues
or topics and the platform key, the offload bucket's payloads, the dedup, idempotency and (for
channels that track status) status tables, and (given the namespace's `ScheduleWiring`) create
one-time schedules for jobs due later (`at`, `delay_seconds`). The channels reach the function as
`MESSENGER_API_CHANNELS` (`messenger.api.channels`' form, written here from each `ChannelSpec`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from messenger.channel import TAG_CHANNEL
from stacks.bundle import LAMBDA_PACKAGES, lambda_bundle
from stacks.channel import QUEUE_ACTIONS_READ_TRACKING, Channel
from stacks.foundation import Foundation
from stacks.nag import acknowledge, acknowledge_wildcard_resource
from stacks.ownership import any_name, ownership_condition, ownership_reason
from stacks.schedules import ScheduleWiring

RUNTIME = lambda_.Runtime.PYTHON_3_11
#: What the API's function imports besides Powertools: pydantic validates the requests.
API_PACKAGES = (*LAMBDA_PACKAGES, "pydantic", "pydantic_core", "annotated_types",
                "typing_inspection")
#: The routes, as `METHOD /resource` (the names `unauthenticated` takes).
ROUTES = ("POST /channels/{channel}/jobs", "POST /channels/{channel}/jobs/batch",
          "GET /jobs/{id}")
#: API Gateway ends an integration after 29 s. The function stops sooner, so that its answer
#: (never a 5xx for an accepted job) is the one the client gets, not API Gateway's 504.
FUNCTION_TIMEOUT = Duration.seconds(25)
#: How long an Idempotency-Key is remembered (the IETF draft suggests at least 24 hours).
DEFAULT_IDEMPOTENCY_WINDOW = Duration.hours(24)
#: The producers' retry budget (MESSENGER_RETRY_BUDGET): an offload and a send fit in the timeout.
RETRY_BUDGET_SECONDS = 8
#: `messenger.api.requests.JobRequest`, for API Gateway's request validator: what it can check
#: before the function runs (the function checks it all again, with the channel's own rules).
JOB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["body"],
    "additionalProperties": False,
    "properties": {
        "body": {},
        "priority": {"type": "string", "minLength": 1},
        "routing_key": {"type": "string", "minLength": 1, "maxLength": 256},
        "group_id": {"type": "string", "minLength": 1, "maxLength": 128},
        "max_attempts": {"type": "integer", "minimum": 1, "maximum": 1000},
        # MAX_DELAY_SECONDS (a year): beyond 900 s, or on an ordered channel, a schedule
        "delay_seconds": {"type": "integer", "minimum": 0, "maximum": 366 * 86_400},
        "at": {"type": "string", "minLength": 20, "maxLength": 35},  # RFC 3339, its zone
        # messenger.api.requests.MAX_DEPENDENCIES job ids; "cancel" or "run"
        "depends_on": {"type": "array", "minItems": 1, "maxItems": 100},
        "on_dependency_failure": {"type": "string", "minLength": 3, "maxLength": 6},
    },
}
BATCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["jobs"],
    "additionalProperties": False,
    "properties": {"jobs": {"type": "array", "minItems": 1, "maxItems": 10}},
}


def api_channels(channels: Sequence[Channel]) -> list[dict[str, Any]]:
    """`MESSENGER_API_CHANNELS` of `channels`: what a producer names (a queue, or the exchange
    of 'exchange.queue' channels, once), from the channels' specs."""
    served: dict[str, dict[str, Any]] = {}
    for channel in channels:
        spec = channel.spec
        name = spec.exchange or spec.name
        served.setdefault(name, {
            "name": name, "exchange": spec.exchange is not None, "ordered": spec.ordered,
            "priorities": list(spec.priorities), "default_priority": spec.default_priority,
            "track_status": spec.track_status,
        })
    return list(served.values())


class HttpEnqueue(Construct):
    """A Regional REST API putting jobs on `channels`.

    channels: the channels it enqueues to (at least one; exchanges by their topic).
    foundation: the platform key, offload bucket and job tables (grants).
    schedules: the namespace's `ScheduleWiring`: the function's role gets its producers'
        statements (CreateSchedule in the group, PassRole to Scheduler only of a scheduler role
        of the API's own, `.scheduler_role`, which may send to the API's channels and the
        schedule DLQ only; MESSENGER_SCHEDULER_ROLE_ARN), so a
        job with `at` or a `delay_seconds` beyond SQS's 15 minutes (any, on an ordered channel
        or an exchange) becomes a one-time schedule (default None: the function may not
        create schedules, and such a job is not accepted). `add_http_enqueue` passes the
        platform's.
    namespace: MESSENGER_NAMESPACE of the function.
    cognito_user_pools: authorize with these Cognito user pools (ID or access tokens) instead
        of IAM (default: none, IAM/SigV4 on every method).
    authorization_scopes: OAuth scopes a Cognito access token needs (default none).
    unauthenticated: routes (`ROUTES` names, e.g. "GET /jobs/{id}") open without authorization
        (default none: never unless named here).
    throttle_rate / throttle_burst: the stage's steady requests per second and burst (default
        50 / 100; API Gateway answers 429 above them, before the function runs).
    usage_plan: per-client throttling: every method needs an API key, and a usage plan with these
        limits is attached to the stage (default None: no API keys). Add each client's key to
        `.usage_plan` (`add_api_key`).
    quota: the usage plan's request quota (default none).
    web_acl_arn: a WAFv2 web ACL to associate with the stage (default none).
    stage_name: default "v1". memory_mib: the function's memory (default 512).
    idempotency_window: how long an Idempotency-Key is remembered (default 24 hours).
    log_retention: of the access logs and the function's logs (default one month).
    Outputs: `api`, `function`, `role`, `access_logs`, `usage_plan` (or None), `url`.
    """

    def __init__(
        self, scope: Construct, id: str, *, channels: Sequence[Channel], foundation: Foundation,
        namespace: str, schedules: ScheduleWiring | None = None,
        cognito_user_pools: Sequence[cognito.IUserPool] = (),
        authorization_scopes: Sequence[str] = (), unauthenticated: Sequence[str] = (),
        throttle_rate: float = 50, throttle_burst: int = 100,
        usage_plan: apigw.ThrottleSettings | None = None,
        quota: apigw.QuotaSettings | None = None, web_acl_arn: str | None = None,
        stage_name: str = "v1", memory_mib: int = 512,
        idempotency_window: Duration = DEFAULT_IDEMPOTENCY_WINDOW,
        log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
    ) -> None:
        super().__init__(scope, id)
        if not channels:
            raise ValueError(f"HttpEnqueue {id!r}: give at least one channel")
        unknown = sorted(set(unauthenticated) - set(ROUTES))
        if unknown:
            raise ValueError(f"HttpEnqueue {id!r}: unauthenticated names {unknown}; the routes "
                             f"are {', '.join(ROUTES)}")
        if authorization_scopes and not cognito_user_pools:
            raise ValueError(f"HttpEnqueue {id!r}: authorization_scopes need cognito_user_pools")
        if not 0 < throttle_rate or not 0 < throttle_burst:
            raise ValueError(f"HttpEnqueue {id!r}: throttle_rate and throttle_burst must be > 0")
        self.channels = list(channels)
        served = api_channels(self.channels)
        self.function, self.role = self._function(
            foundation, namespace, served, memory_mib, idempotency_window, log_retention,
            schedules=schedules is not None)
        self.scheduler_role: iam.Role | None = None
        if schedules is not None:
            # Jobs due later: one-time schedules, sent by a scheduler role of the API's own,
            # which may send to the API's channels only (the namespace's role reaches every
            # channel of the namespace).
            self.scheduler_role = schedules.scheduler_role_for(self, "SchedulerRole",
                                                               self.channels)
            schedules.grant_one_time(self.role, scheduler_role=self.scheduler_role)
            self.function.add_environment("MESSENGER_SCHEDULER_ROLE_ARN",
                                          self.scheduler_role.role_arn)
        self.access_logs = logs.LogGroup(self, "AccessLogs", retention=log_retention,
                                          removal_policy=RemovalPolicy.DESTROY)
        self.api = apigw.RestApi(
            self, "Api",
            rest_api_name=f"{namespace + '-' if namespace else ''}messenger-jobs",
            description=f"messenger HTTP enqueue: {', '.join(c['name'] for c in served)}",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            cloud_watch_role=False,  # the account's API Gateway logging role is the account's
            deploy_options=apigw.StageOptions(
                stage_name=stage_name,
                throttling_rate_limit=throttle_rate,
                throttling_burst_limit=throttle_burst,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True, http_method=True, ip=True, protocol=True, request_time=True,
                    resource_path=True, response_length=True, status=True, user=True),
                tracing_enabled=True,
                metrics_enabled=True,
            ),
        )
        self._gateway_responses()
        self.usage_plan = None
        if usage_plan is not None or quota is not None:
            self.usage_plan = self.api.add_usage_plan(
                "UsagePlan", throttle=usage_plan, quota=quota,
                api_stages=[apigw.UsagePlanPerApiStage(api=self.api,
                                                       stage=self.api.deployment_stage)])
        self._methods(cognito_user_pools, authorization_scopes, set(unauthenticated),
                      api_key_required=self.usage_plan is not None)
        if web_acl_arn is not None:
            wafv2.CfnWebACLAssociation(self, "WebAcl", web_acl_arn=web_acl_arn,
                                       resource_arn=self.api.deployment_stage.stage_arn)
        else:
            acknowledge(self.api, "AwsSolutions-APIG3",
                        "Every method is authorized (IAM SigV4 or Cognito) and the stage is "
                        "throttled; give web_acl_arn to put the account's WAF web ACL in front.")
        acknowledge(self.api, "AwsSolutions-APIG6",
                    "Access logs record every request; execution logs need the account-wide "
                    "API Gateway CloudWatch role, which this construct does not take over.")
        self.url = self.api.url
        CfnOutput(self, "Url", value=self.api.url)

    def _function(self, foundation: Foundation, namespace: str, served: list[dict[str, Any]],
                  memory_mib: int, window: Duration, retention: logs.RetentionDays,
                  schedules: bool) -> tuple[lambda_.Function, iam.Role]:
        log_group = logs.LogGroup(self, "Logs", retention=retention,
                                  removal_policy=RemovalPolicy.DESTROY)
        # An explicit role: the default one carries the AWS-managed basic execution policy,
        # which may write to every log group of the account.
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description="messenger HTTP enqueue (API Gateway to channels)")
        log_group.grant_write(role)
        function = lambda_.Function(
            self, "Function",
            runtime=RUNTIME,
            architecture=lambda_.Architecture.X86_64,
            handler="lambdas.http_enqueue.handler.handler",
            code=lambda_.Code.from_asset(str(lambda_bundle("http_enqueue", API_PACKAGES))),
            role=role,
            log_group=log_group,
            memory_size=memory_mib,
            timeout=FUNCTION_TIMEOUT,
            tracing=lambda_.Tracing.ACTIVE,
            environment={
                "MESSENGER_API_CHANNELS": json.dumps(served, separators=(",", ":")),
                "MESSENGER_PROVISIONING": "verify",
                "MESSENGER_NAMESPACE": namespace,
                "MESSENGER_KMS_KEY": foundation.key.key_arn,
                "MESSENGER_OFFLOAD_BUCKET": foundation.offload_bucket_name,
                "MESSENGER_RETRY_BUDGET": str(RETRY_BUDGET_SECONDS),
                "MESSENGER_API_IDEMPOTENCY_WINDOW": str(int(window.to_seconds())),
                "POWERTOOLS_SERVICE_NAME": "messenger-http-enqueue",
            },
            description="messenger HTTP enqueue: jobs onto "
                        + ", ".join(channel["name"] for channel in served),
        )
        for channel in self.channels:
            channel.grant_publish(role)
        foundation.grant_offload_write(role)
        foundation.grant_dedup(role)  # an Idempotency-Key's job id is pushed with dedup on
        foundation.grant_idempotency(role)  # Powertools' records of the keys
        if any(channel["track_status"] for channel in served):
            foundation.grant_status_write(role)  # QUEUED
            iam.Grant.add_to_principal(  # GET /jobs/{id}: the timeline of one job
                grantee=role, actions=["dynamodb:Query"],
                resource_arns=[foundation.status_table.table_arn])
        # A job's depends_on (its dependencies may be on any channel of the namespace; the job
        # is held in the workflows table, and released here, to its own channel, when they are
        # final already), and GET /jobs/{id}'s result or error, dependencies and dependents.
        foundation.grant_workflows(role, releases=False)
        # GET /jobs/{id} of a job on a tracked exchange reads the declaration of every queue
        # subscribed to its topic (a queue channel's: grant_publish's ListQueueTags).
        exchanges = [c["name"] for c in served if c["exchange"] and c["track_status"]]
        for exchange in exchanges:
            channel = next(c for c in self.channels if c.spec.exchange == exchange)
            self._grant_exchange_declarations(role, channel, namespace)
        policy = role.node.try_find_child("DefaultPolicy")
        assert policy is not None
        if exchanges:
            acknowledge_wildcard_resource(policy, self._queues_arn(),
                                          ownership_reason(namespace))
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "Active tracing: X-Ray's PutTraceSegments and PutTelemetryRecords have no "
                    "resource types, so IAM grants them on * only"
                    + ("; so has scheduler:ListSchedules (listing the jobs due later)"
                       if schedules else "") + "; nothing else is on *.")
        acknowledge(function, "AwsSolutions-L1",
                    "Pinned to Python 3.11, the version the library, its bundled dependencies "
                    "and the tests use; upgraded together with the project's Python.")
        return function, role

    def _queues_arn(self) -> str:
        stack = Stack.of(self)
        return any_name("sqs", stack.region, stack.account)

    def _grant_exchange_declarations(self, role: iam.Role, channel: Channel,
                                     namespace: str) -> None:
        """What `TrackingDeclarations.of_exchange` reads: the subscriptions of the exchange's
        topic (its exact ARN), then GetQueueUrl and ListQueueTags of each subscribed queue.
        Consumers in auto mode subscribe queues at run time, so these are named by their tags:
        the namespace's, `messenger:role=queue` and a `messenger:channel` of this exchange
        ('<exchange>.<queue>', a priority level's '<exchange>.<queue>-<level>')."""
        assert channel.spec.exchange is not None
        role.add_to_policy(iam.PolicyStatement(
            actions=["sns:ListSubscriptionsByTopic"], resources=[channel.topic_arn_in(role)]))
        conditions = ownership_condition(namespace, "queue")
        conditions["StringLike"] = {
            f"aws:ResourceTag/{TAG_CHANNEL}": f"{channel.spec.exchange}.*"}
        role.add_to_policy(iam.PolicyStatement(
            actions=["sqs:GetQueueUrl", *QUEUE_ACTIONS_READ_TRACKING],
            resources=[self._queues_arn()], conditions=conditions))

    def _methods(self, user_pools: Sequence[cognito.IUserPool], scopes: Sequence[str],
                 unauthenticated: set[str], api_key_required: bool) -> None:
        integration = apigw.LambdaIntegration(self.function, proxy=True)
        validator = self.api.add_request_validator(
            "Validator", validate_request_body=True, validate_request_parameters=True)
        models = {
            "job": self.api.add_model("Job", content_type="application/json", schema=_schema(
                JOB_SCHEMA), model_name="MessengerJob"),
            "batch": self.api.add_model("Batch", content_type="application/json", schema=_schema(
                BATCH_SCHEMA), model_name="MessengerJobBatch"),
        }
        authorizer = None
        if user_pools:
            authorizer = apigw.CognitoUserPoolsAuthorizer(
                self, "Authorizer", cognito_user_pools=list(user_pools))
        jobs = self.api.root.add_resource("channels").add_resource("{channel}") \
            .add_resource("jobs")
        resources = {
            ROUTES[0]: (jobs, models["job"]),
            ROUTES[1]: (jobs.add_resource("batch"), models["batch"]),
            ROUTES[2]: (self.api.root.add_resource("jobs").add_resource("{id}"), None),
        }
        self.methods: dict[str, apigw.Method] = {}
        for route, (resource, model) in resources.items():
            verb = route.split()[0]
            options: dict[str, Any] = {"api_key_required": api_key_required}
            if model is not None:
                options.update(request_validator=validator,
                               request_models={"application/json": model})
            if route in unauthenticated:
                options["authorization_type"] = apigw.AuthorizationType.NONE
            elif authorizer is not None:
                options.update(authorization_type=apigw.AuthorizationType.COGNITO,
                               authorizer=authorizer,
                               authorization_scopes=list(scopes) or None)
            else:
                options["authorization_type"] = apigw.AuthorizationType.IAM
            method = resource.add_method(verb, integration, **options)
            self.methods[route] = method
            if route in unauthenticated:
                acknowledge(method, "AwsSolutions-APIG4",
                            f"{route} is open without authorization because the stack line "
                            f"asked for it by name (HttpEnqueue(unauthenticated=...)).")
            if authorizer is None or route in unauthenticated:
                acknowledge(method, "AwsSolutions-COG4",
                            "Authorized with IAM (SigV4) by default; a Cognito user pool "
                            "authorizer is the opt-in cognito_user_pools option.")

    def _gateway_responses(self) -> None:
        """What API Gateway answers itself, in the function's shape ({"error": "..."})."""
        json_error = {"application/json": '{"error": "$context.error.validationErrorString"}'}
        self.api.add_gateway_response(
            "BadRequestBody", type=apigw.ResponseType.BAD_REQUEST_BODY, status_code="400",
            templates=json_error)
        self.api.add_gateway_response(
            "Throttled", type=apigw.ResponseType.THROTTLED, status_code="429",
            response_headers={"Retry-After": "'1'"},
            templates={"application/json": '{"error": "throttled: retry later"}'})
        self.api.add_gateway_response(
            "TooLarge", type=apigw.ResponseType.REQUEST_TOO_LARGE, status_code="413",
            templates={"application/json": '{"error": "request body above API Gateway\'s '
                                           '10 MB"}'})
        # Every other answer API Gateway writes itself (an unknown route or method, which it
        # answers 403 "Missing Authentication Token"; a 504 integration timeout; a refused
        # signature) in the same shape. $context.error.messageString is already a quoted string.
        own_message = {"application/json": '{"error": $context.error.messageString}'}
        self.api.add_gateway_response(
            "Other4xx", type=apigw.ResponseType.DEFAULT_4_XX, templates=own_message)
        self.api.add_gateway_response(
            "Other5xx", type=apigw.ResponseType.DEFAULT_5_XX, templates=own_message)


def _schema(schema: dict[str, Any]) -> apigw.JsonSchema:
    """A JSON schema dict as API Gateway's model schema (draft 4)."""
    kinds = {"object": apigw.JsonSchemaType.OBJECT, "string": apigw.JsonSchemaType.STRING,
             "integer": apigw.JsonSchemaType.INTEGER, "array": apigw.JsonSchemaType.ARRAY}
    options: dict[str, Any] = {}
    if "type" in schema:
        options["type"] = kinds[schema["type"]]
    for key, option in (("required", "required"), ("minLength", "min_length"),
                        ("maxLength", "max_length"), ("minimum", "minimum"),
                        ("maximum", "maximum"), ("minItems", "min_items"),
                        ("maxItems", "max_items"),
                        ("additionalProperties", "additional_properties")):
        if key in schema:
            options[option] = schema[key]
    if "properties" in schema:
        options["properties"] = {name: _schema(value)
                                 for name, value in schema["properties"].items()}
    if schema is JOB_SCHEMA or schema is BATCH_SCHEMA:
        options["schema"] = apigw.JsonSchemaVersion.DRAFT4
    return apigw.JsonSchema(**options)
