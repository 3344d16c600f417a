"""`DashboardService`: the team dashboard on AWS, behind a login (issue 43).

```python
platform.add_dashboard(certificate=cert, domain_name="messenger.example.com",
                       login=CognitoLogin(domain_prefix="shop-messenger"))
```

An internet-facing Application Load Balancer whose HTTPS listener has one action chain and no
rules: authenticate (`authenticate-cognito` with a user pool the construct creates or one given,
or `authenticate-oidc` with a team's own provider), then forward to a Lambda function running
the same Starlette app as `messenger dashboard` (mangum). Port 80 only redirects to HTTPS. There
is no path around the login: the function has no URL and only this load balancer's target group
may invoke it, and the app itself refuses (401) any request without the load balancer's signed
identity header (`messenger.tools.dashboard.auth`).

The function's role reads the namespace's queues, metrics, status and worker tables; the
operators' actions are the only writes: receive/delete on the namespace's DLQs (requeue and
delete), send to its queues (requeue), the status records naming who did it.

Roles: a user in one of `operator_groups` (the claim `groups_claim` of the signed header) is an
operator, everyone else signed in is a viewer. A Cognito pool this construct creates keeps a
user's groups in the custom attribute `custom:groups` (the header's claims are the provider's
userinfo, which carries user attributes, not `cognito:groups`); only an administrator can write
it (the app client may read, not write, it).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import (
    Aws,
    CfnOutput,
    Duration,
    Names,
    RemovalPolicy,
    SecretValue,
    Stack,
)
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_elasticloadbalancingv2_actions as elbv2_actions
from aws_cdk import aws_elasticloadbalancingv2_targets as elbv2_targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

from messenger.channel import (
    FIRED_CLAIM_PREFIX,
    audit_table_name,
    dedup_table_name,
    lambda_consumer_prefix,
    schedule_group_name,
    status_table_name,
    workers_table_name,
)
from stacks.bundle import IGNORE_CODE, REPO_ROOT, staging_root
from stacks.flow_control import grant_limits_operate
from stacks.foundation import Foundation, log_access
from stacks.nag import acknowledge, acknowledge_wildcard_resource
from stacks.ownership import any_name, ownership_condition, ownership_reason

#: The partition of the pause records in the worker registry's table
#: (`messenger.jobs.controls.PAUSE_PARTITION`; tests/infra check they agree).
PAUSE_RECORDS_PARTITION = "~paused"
#: The queue tag a pause sets (`messenger.jobs.controls.TAG_PAUSED`): the only tag key the
#: dashboard may put or remove.
TAG_PAUSED = "messenger:paused"
#: The attributes of a cancel request's item (`messenger.jobs.controls.CancelRequest.item`):
#: the only ones the dashboard's cancel may write (a worker's entry has others).
CANCEL_REQUEST_ATTRIBUTES = ("channel", "worker_id", "by", "at", "expires_at")

#: What the image's Dockerfile needs from the repository (its build context, staged at synth).
IMAGE_FILES = ("messenger", "lambdas/dashboard", "pyproject.toml", "requirements.txt",
               "README.md")
#: The load balancer gives a Lambda target at most this long; the app answers sooner.
FUNCTION_TIMEOUT = Duration.seconds(30)
#: ALB target group names have at most 32 characters.
TARGET_GROUP_NAME_LENGTH = 32
#: Where the load balancer's access logs go in the platform's access-log bucket.
ACCESS_LOG_PREFIX = "dashboard-alb"
#: The claim a pool created here keeps a user's groups in.
COGNITO_GROUPS_CLAIM = "custom:groups"


@dataclass(frozen=True)
class CognitoLogin:
    """Sign in with a Cognito user pool (`authenticate-cognito`).

    domain_prefix: the hosted UI's domain prefix (`<prefix>.auth.<region>.amazoncognito.com`),
        for a pool created here. user_pool / user_pool_client / user_pool_domain: a pool of the
        team's own (all three; the client must have a secret, the code grant and the callback
        `https://<domain_name>/oauth2/idpresponse`); None: a pool is created (no self sign-up,
        MFA required, administrators add users and their groups).
    groups_claim: where the signed header carries a user's groups (default `custom:groups`).
    """

    domain_prefix: str = ""
    user_pool: cognito.IUserPool | None = None
    user_pool_client: cognito.IUserPoolClient | None = None
    user_pool_domain: cognito.IUserPoolDomain | None = None
    groups_claim: str = COGNITO_GROUPS_CLAIM


@dataclass(frozen=True)
class OidcLogin:
    """Sign in with the team's own OpenID Connect provider (`authenticate-oidc`).

    issuer, authorization_endpoint, token_endpoint, user_info_endpoint: the provider's.
    client_id / client_secret: the app client registered there (callback
    `https://<domain_name>/oauth2/idpresponse`); the secret must be a Secrets Manager secret
    (`SecretValue.secrets_manager(...)` or a `Secret`'s `secret_value`): any other SecretValue
    (`unsafe_plain_text`) is refused at synth, it would be in the template in plain text.
    groups_claim: the userinfo claim with the groups.
    """

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    user_info_endpoint: str
    client_id: str
    client_secret: SecretValue
    groups_claim: str = "groups"
    scope: str = "openid email profile"


class DashboardService(Construct):
    """The dashboard of `namespace` behind an authenticating load balancer.

    foundation: the platform key, tables and offload bucket (grants). vpc: where the load
    balancer lives (public subnets). certificate / domain_name: the HTTPS certificate and the
    name users open (point it at `.load_balancer`). login: `CognitoLogin` or `OidcLogin`.
    operator_groups: groups whose members may requeue and delete (default ("operators",)).
    allowed_cidrs: who may reach the load balancer (default everyone: the login guards it).
    refresh_seconds: live updates' interval (default 5). memory_mib: default 1024.
    web_acl_arn: a WAFv2 web ACL (scope REGIONAL) to associate with the load balancer (default
        none). deletion_protection: the load balancer's (default on: a `cdk destroy` or a
        replacement fails until it is turned off).
    The load balancer's access logs go to the platform's access-log bucket (`dashboard-alb/`),
    also when the stack is environment-agnostic (`foundation.log_access`).
    Outputs: `load_balancer`, `function`, `role`, `user_pool` (None for OIDC or a given pool),
    `https_listener`, `url`.
    """

    def __init__(
        self, scope: Construct, id: str, *, foundation: Foundation, vpc: ec2.IVpc,
        namespace: str, certificate: acm.ICertificate, domain_name: str,
        login: CognitoLogin | OidcLogin, operator_groups: Sequence[str] = ("operators",),
        allowed_cidrs: Sequence[str] = ("0.0.0.0/0",), refresh_seconds: int = 5,
        memory_mib: int = 1024, log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        web_acl_arn: str | None = None, deletion_protection: bool = True,
    ) -> None:
        super().__init__(scope, id)
        if not domain_name or "/" in domain_name:
            raise ValueError(f"DashboardService {id!r}: domain_name is a host name, got "
                             f"{domain_name!r}")
        if isinstance(login, CognitoLogin) and login.user_pool is None \
                and not login.domain_prefix:
            raise ValueError(f"DashboardService {id!r}: CognitoLogin needs domain_prefix (or a "
                             f"user pool, client and domain of your own)")
        if isinstance(login, OidcLogin):
            _require_secret_reference(self, login.client_secret)
        if not allowed_cidrs:
            raise ValueError(f"DashboardService {id!r}: allowed_cidrs is empty: nobody could "
                             f"reach it")
        self.namespace = namespace
        self.user_pool: cognito.UserPool | None = None
        security_group = ec2.SecurityGroup(
            self, "LoadBalancerSecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="messenger dashboard load balancer: HTTPS (and HTTP to redirect) in")
        for cidr in allowed_cidrs:
            for port in (443, 80):
                security_group.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(port),
                                                f"dashboard users ({port})")
        # Authenticating needs the IdP's token and userinfo endpoints over HTTPS.
        security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443),
                                       "the identity provider's endpoints")
        self.load_balancer = elbv2.ApplicationLoadBalancer(
            self, "LoadBalancer", vpc=vpc, internet_facing=True, security_group=security_group,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC),
            drop_invalid_header_fields=True, http2_enabled=True,
            deletion_protection=deletion_protection,
        )
        log_access(self.load_balancer, foundation.access_logs, ACCESS_LOG_PREFIX)
        self.web_acl = None
        if web_acl_arn is not None:
            self.web_acl = wafv2.CfnWebACLAssociation(
                self, "WebAcl", web_acl_arn=web_acl_arn,
                resource_arn=self.load_balancer.load_balancer_arn)
        cognito_parts = None
        if isinstance(login, OidcLogin):
            self.client_id = login.client_id
        else:
            cognito_parts = (login.user_pool, login.user_pool_client, login.user_pool_domain)
            if None in cognito_parts:
                cognito_parts = self._user_pool(login, domain_name)
            self.client_id = cognito_parts[1].user_pool_client_id  # type: ignore[union-attr]
        self.audit_table = self._audit_table(foundation)
        self.function, self.role = self._function(foundation, login, operator_groups,
                                                  refresh_seconds, memory_mib, log_retention)
        # Named, so that the invoke permission can name it before it exists: the group
        # registers the function only once the permission does (a Ref would be a cycle).
        self.target_group_name = Names.unique_resource_name(
            self, max_length=TARGET_GROUP_NAME_LENGTH, separator="-")
        target_group = elbv2.ApplicationTargetGroup(
            self, "Target", target_group_name=self.target_group_name,
            targets=[elbv2_targets.LambdaTarget(self.function)])
        # LambdaTarget lets elasticloadbalancing.amazonaws.com invoke the function with no
        # condition; limit it to this target group: its name (unique in the account and
        # region) and the ARN's random suffix, which only the deploy makes.
        stack = Stack.of(self)
        self.target_group_arn_pattern = (
            f"arn:{Aws.PARTITION}:elasticloadbalancing:{stack.region}:{stack.account}:"
            f"targetgroup/{self.target_group_name}/*")
        for child in self.function.node.find_all():
            if isinstance(child, lambda_.CfnPermission) \
                    and child.principal == "elasticloadbalancing.amazonaws.com":
                child.add_property_override("SourceAccount", stack.account)
                child.add_property_override("SourceArn", self.target_group_arn_pattern)
        forward = elbv2.ListenerAction.forward([target_group])
        self.https_listener = self.load_balancer.add_listener(
            "Https", port=443, protocol=elbv2.ApplicationProtocol.HTTPS,
            certificates=[elbv2.ListenerCertificate.from_certificate_manager(certificate)],
            ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS, open=False,
            default_action=self._authenticate(login, cognito_parts, forward),
        )
        self.load_balancer.add_redirect(source_port=80, target_port=443)
        acknowledge(security_group, "AwsSolutions-EC23",
                    "The dashboard is for people signing in from anywhere (allowed_cidrs "
                    "narrows it); every request is authenticated by the listener and verified "
                    "again by the app, and port 80 only redirects to HTTPS.")
        self.url = f"https://{domain_name}/"
        CfnOutput(self, "Url", value=self.url)
        CfnOutput(self, "LoadBalancerDnsName", value=self.load_balancer.load_balancer_dns_name)

    # -- login ----------------------------------------------------------------------------
    def _authenticate(self, login: CognitoLogin | OidcLogin, cognito_parts: tuple | None,
                      forward: elbv2.ListenerAction) -> elbv2.ListenerAction:
        if isinstance(login, OidcLogin):
            return elbv2.ListenerAction.authenticate_oidc(
                issuer=login.issuer, authorization_endpoint=login.authorization_endpoint,
                token_endpoint=login.token_endpoint, user_info_endpoint=login.user_info_endpoint,
                client_id=login.client_id, client_secret=login.client_secret, scope=login.scope,
                on_unauthenticated_request=elbv2.UnauthenticatedAction.AUTHENTICATE,
                session_timeout=Duration.hours(8), next=forward)
        assert cognito_parts is not None
        pool, client, domain = cognito_parts
        return elbv2_actions.AuthenticateCognitoAction(
            user_pool=pool, user_pool_client=client, user_pool_domain=domain,
            scope="openid email profile", session_timeout=Duration.hours(8),
            on_unauthenticated_request=elbv2.UnauthenticatedAction.AUTHENTICATE, next=forward)

    def _user_pool(self, login: CognitoLogin, domain_name: str
                   ) -> tuple[cognito.UserPool, cognito.UserPoolClient, cognito.UserPoolDomain]:
        pool = cognito.UserPool(
            self, "UserPool",
            user_pool_name=f"{self.namespace + '-' if self.namespace else ''}messenger-dashboard",
            self_sign_up_enabled=False,
            sign_in_aliases=cognito.SignInAliases(email=True),
            mfa=cognito.Mfa.REQUIRED,
            mfa_second_factor=cognito.MfaSecondFactor(sms=False, otp=True),
            password_policy=cognito.PasswordPolicy(
                min_length=14, require_digits=True, require_lowercase=True,
                require_uppercase=True, require_symbols=True,
                temp_password_validity=Duration.days(3)),
            account_recovery=cognito.AccountRecovery.EMAIL_ONLY,
            custom_attributes={"groups": cognito.StringAttribute(min_len=0, max_len=2048,
                                                                  mutable=True)},
            feature_plan=cognito.FeaturePlan.PLUS,
            standard_threat_protection_mode=cognito.StandardThreatProtectionMode.FULL_FUNCTION,
            removal_policy=RemovalPolicy.RETAIN,
        )
        client = pool.add_client(
            "Client", generate_secret=True,
            o_auth=cognito.OAuthSettings(
                flows=cognito.OAuthFlows(authorization_code_grant=True),
                scopes=[cognito.OAuthScope.OPENID, cognito.OAuthScope.EMAIL,
                        cognito.OAuthScope.PROFILE],
                callback_urls=[f"https://{domain_name}/oauth2/idpresponse"]),
            # Users read their groups; only administrators (AdminUpdateUserAttributes) set them.
            read_attributes=cognito.ClientAttributes().with_standard_attributes(
                email=True, email_verified=True).with_custom_attributes("groups"),
            write_attributes=cognito.ClientAttributes().with_standard_attributes(email=True),
            prevent_user_existence_errors=True,
        )
        domain = pool.add_domain("Domain", cognito_domain=cognito.CognitoDomainOptions(
            domain_prefix=login.domain_prefix))
        self.user_pool = pool
        return pool, client, domain

    # -- the audit trail ------------------------------------------------------------------
    def _audit_table(self, foundation: Foundation) -> dynamodb.Table:
        """`messenger.operations.audit`'s table: every operator action and refused attempt,
        made with the dashboard (so it exists wherever the dashboard does, with or without a
        status table). Retained when the stack goes, deletion-protected, point-in-time
        recovery on, the platform key; entries expire by TTL."""
        return dynamodb.Table(
            self, "AuditTable", table_name=audit_table_name(self.namespace),
            partition_key=dynamodb.Attribute(name="day", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="entry", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.CUSTOMER_MANAGED, encryption_key=foundation.key,
            time_to_live_attribute="expires_at", deletion_protection=True,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True),
            removal_policy=RemovalPolicy.RETAIN)

    # -- the function ---------------------------------------------------------------------
    def _function(self, foundation: Foundation, login: CognitoLogin | OidcLogin,
                  operator_groups: Sequence[str], refresh_seconds: int, memory_mib: int,
                  retention: logs.RetentionDays) -> tuple[lambda_.Function, iam.Role]:
        log_group = logs.LogGroup(self, "Logs", retention=retention,
                                  removal_policy=RemovalPolicy.DESTROY)
        # An explicit role: the default one carries the AWS-managed basic execution policy,
        # which may write to every log group of the account.
        role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                        description="messenger dashboard (read the namespace; operators' "
                                    "requeue and delete)")
        log_group.grant_write(role)
        function = lambda_.DockerImageFunction(
            self, "Function",
            code=lambda_.DockerImageCode.from_image_asset(str(_image_context())),
            architecture=lambda_.Architecture.X86_64,
            role=role, log_group=log_group, memory_size=memory_mib, timeout=FUNCTION_TIMEOUT,
            tracing=lambda_.Tracing.ACTIVE,
            environment={
                "MESSENGER_NAMESPACE": self.namespace,
                "MESSENGER_PROVISIONING": "verify",
                "MESSENGER_DASHBOARD_ALB_ARN": self.load_balancer.load_balancer_arn,
                "MESSENGER_DASHBOARD_CLIENT_ID": self.client_id,
                "MESSENGER_DASHBOARD_OPERATOR_GROUPS": ",".join(operator_groups),
                "MESSENGER_DASHBOARD_GROUPS_CLAIM": login.groups_claim,
                "MESSENGER_DASHBOARD_REFRESH": str(refresh_seconds),
                "POWERTOOLS_SERVICE_NAME": "messenger-dashboard",
            },
            description=f"messenger dashboard of namespace {self.namespace or '(none)'}",
        )
        self._grant(role, foundation)
        return function, role

    def _grant(self, role: iam.Role, foundation: Foundation) -> None:
        """The role's statements (docs/cdk-guide.md lists them): exact ARNs where the names are
        known at synth (tables, the schedule group), else the namespace's tags
        (`stacks.ownership`): a name prefix is no boundary (`shop-*` matches `shop-eu-...`, and
        the default namespace has none)."""
        stack = Stack.of(self)
        queues = any_name("sqs", stack.region, stack.account)
        topics = any_name("sns", stack.region, stack.account)
        table = f"arn:{Aws.PARTITION}:dynamodb:{stack.region}:{stack.account}:table/"
        workers = table + workers_table_name(self.namespace)
        lambda_arn = f"arn:{Aws.PARTITION}:lambda:{stack.region}:{stack.account}"
        schedules = (f"arn:{Aws.PARTITION}:scheduler:{stack.region}:{stack.account}:schedule/"
                     f"{schedule_group_name(self.namespace)}/*")
        ours = ownership_condition(self.namespace)
        statements = [
            # Reading: which queues are the namespace's (tags), their depths, their metrics.
            iam.PolicyStatement(sid="FindQueuesByTag", actions=["tag:GetResources"],
                                resources=["*"]),
            iam.PolicyStatement(sid="ReadMetrics", actions=["cloudwatch:GetMetricData"],
                                resources=["*"]),
            iam.PolicyStatement(sid="ReadQueues",
                                actions=["sqs:GetQueueUrl", "sqs:GetQueueAttributes",
                                         "sqs:ListQueueTags"], resources=[queues],
                                conditions=ours),
            # A DLQ page holds its letters while it reads them; requeue and delete take them:
            # only the namespace's dead-letter queues (messenger:role=dlq).
            iam.PolicyStatement(sid="OperateDeadLetters",
                                actions=["sqs:ReceiveMessage", "sqs:ChangeMessageVisibility",
                                         "sqs:DeleteMessage"], resources=[queues],
                                conditions=ownership_condition(self.namespace, "dlq")),
            # Requeue: a letter goes back to its own queue of the namespace.
            iam.PolicyStatement(sid="RequeueToQueues", actions=["sqs:SendMessage"],
                                resources=[queues], conditions=ours),
            iam.PolicyStatement(sid="ReadStatusAndWorkers",
                                actions=["dynamodb:DescribeTable", "dynamodb:Query",
                                         "dynamodb:Scan"],
                                resources=[table + status_table_name(self.namespace), workers]),
            # Scheduled jobs: list them (no resource types in IAM), and an operator's cancel
            # deletes one's schedule, in the namespace's own group (named exactly).
            iam.PolicyStatement(sid="ListScheduledJobs", actions=["scheduler:ListSchedules"],
                                resources=["*"]),
            iam.PolicyStatement(sid="CancelScheduledJobs",
                                actions=["scheduler:GetSchedule", "scheduler:DeleteSchedule"],
                                resources=[schedules]),
            # A cancel takes the job's claim first (messenger.jobs.fired.cancel: "cancelled"
            # means it never runs), and a requeue gives a redriven copy's claim back: the dedup
            # table's consumer claims only (fired@...), never a producer's dedup claim.
            iam.PolicyStatement(sid="ClaimCancelledJobs",
                                actions=["dynamodb:GetItem", "dynamodb:PutItem",
                                         "dynamodb:DeleteItem"],
                                resources=[table + dedup_table_name(self.namespace)],
                                conditions={"ForAllValues:StringLike": {
                                    "dynamodb:LeadingKeys": [f"{FIRED_CLAIM_PREFIX}*"]}}),
            iam.PolicyStatement(sid="CheckClaimsTable", actions=["dynamodb:DescribeTable"],
                                resources=[table + dedup_table_name(self.namespace)]),
            # A cancelled job sent to an exchange: its claim is taken on the channel of every
            # queue subscribed to the topic (ScheduleStore.cancel lists them; ReadQueues reads
            # each queue's channel tag). The namespace's topics only (tags, messenger:role=topic:
            # exchanges are made at run time too); the action takes the topic resource type.
            iam.PolicyStatement(sid="ListExchangeSubscriptions",
                                actions=["sns:ListSubscriptionsByTopic"], resources=[topics],
                                conditions=ownership_condition(self.namespace, "topic")),
            # The audit trail: append (each entry put under attribute_not_exists) and read;
            # no UpdateItem, DeleteItem or BatchWriteItem, so no entry is changed or removed.
            iam.PolicyStatement(sid="AppendAuditTrail",
                                actions=["dynamodb:DescribeTable", "dynamodb:PutItem",
                                         "dynamodb:Query"],
                                resources=[table + audit_table_name(self.namespace)]),
            # Who requeued or deleted a job, on its timeline.
            iam.PolicyStatement(sid="RecordOperatorActions",
                                actions=["dynamodb:BatchWriteItem", "dynamodb:PutItem"],
                                resources=[table + status_table_name(self.namespace)]),
            # Pause and resume a channel's consumers: the queue's messenger:paused tag (no
            # other tag key: the namespace tags decide what the platform may touch) ...
            iam.PolicyStatement(
                sid="PauseQueues", actions=["sqs:TagQueue", "sqs:UntagQueue"],
                resources=[queues],
                conditions={**ours, "ForAllValues:StringEquals": {"aws:TagKeys": [TAG_PAUSED]}}),
            # ... and its Lambda consumers' event source mappings (listing has no resource type)
            iam.PolicyStatement(sid="FindEventSourceMappings",
                                actions=["lambda:ListEventSourceMappings"], resources=["*"]),
            # A mapping's ARN is a UUID made at deploy time: the mappings that may be updated
            # are those invoking the namespace's consumer functions (named by LambdaConsumer;
            # another namespace's are '<its namespace>-messenger-consumer-...').
            iam.PolicyStatement(
                sid="PauseLambdaConsumers", actions=["lambda:UpdateEventSourceMapping"],
                resources=[f"{lambda_arn}:event-source-mapping:*"],
                conditions={"ArnLike": {"lambda:FunctionArn": [
                    f"{lambda_arn}:function:{lambda_consumer_prefix(self.namespace)}*"]}}),
            # Cancel a running job: a request item (partition: the channel; attributes: a cancel
            # request's only) in the worker registry's table; never a pause record, nor a
            # worker's entry (its attributes are others).
            iam.PolicyStatement(
                sid="CancelRunningJobs", actions=["dynamodb:PutItem"], resources=[workers],
                conditions={
                    "ForAllValues:StringNotEquals": {
                        "dynamodb:LeadingKeys": [PAUSE_RECORDS_PARTITION]},
                    "ForAllValues:StringEquals": {
                        "dynamodb:Attributes": list(CANCEL_REQUEST_ATTRIBUTES)},
                }),
            # A pause's record there (its source of truth, which no deploy touches): pause
            # puts it, resume deletes it.
            iam.PolicyStatement(sid="RecordPauses",
                                actions=["dynamodb:PutItem", "dynamodb:DeleteItem"],
                                resources=[workers],
                                conditions={"ForAllValues:StringEquals": {
                                    "dynamodb:LeadingKeys": [PAUSE_RECORDS_PARTITION]}}),
        ]
        for statement in statements:
            role.add_to_policy(statement)
        foundation.key.grant(role, "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey")
        foundation.grant_offload_read(role)  # a letter's offloaded body
        # A job's result, dependencies and dependents, a group's progress; and an operator's
        # final action (a dead letter deleted, a scheduled job cancelled) settles the job and
        # advances what waits on it (jobs.workflows.Workflows.settle).
        foundation.grant_workflows(role)
        # Each channel page's limits, and an operator's change of them (jobs.limits.LimitStore):
        # every item read, limits records only written.
        grant_limits_operate(role, self.namespace, foundation.key)
        policy = role.node.try_find_child("DefaultPolicy")
        assert policy is not None
        acknowledge(policy, "AwsSolutions-IAM5[Resource::*]",
                    "tag:GetResources, cloudwatch:GetMetricData, scheduler:ListSchedules, "
                    "lambda:ListEventSourceMappings (pause finds a queue's mappings) and X-Ray's "
                    "trace writes have no resource types, so IAM grants them on * only; they "
                    "read, never change.")
        acknowledge_wildcard_resource(
            policy, f"{lambda_arn}:event-source-mapping:*",
            "A mapping's ARN is its UUID, made at deploy time; the statement's condition "
            "(ArnLike lambda:FunctionArn) limits it to mappings invoking the namespace's "
            "consumer functions ('<namespace->messenger-consumer-*'), which pause and "
            "resume only enable or disable.")
        # (the resources as granted: acknowledge_wildcard_resource prints a region or account
        # token as cdk-nag does, <AWS::Region> and <AWS::AccountId>)
        acknowledge_wildcard_resource(
            policy, schedules,
            "Scheduled jobs are schedules created at run time in the namespace's own "
            "schedule group (named exactly); an operator's cancel deletes one of them.")
        acknowledge_wildcard_resource(policy, queues, ownership_reason(self.namespace))
        acknowledge_wildcard_resource(policy, topics, ownership_reason(self.namespace))


def _require_secret_reference(scope: Construct, secret: SecretValue) -> None:
    """An OIDC client secret must reach the template as a Secrets Manager dynamic reference,
    never as its value (`SecretValue.unsafe_plain_text` would put it there in plain text)."""
    # (unwrapped only to look at what the template would get; nothing is written)
    resolved = json.dumps(Stack.of(scope).resolve(secret.unsafe_unwrap()))
    if "{{resolve:secretsmanager:" not in resolved:
        raise ValueError(
            "OidcLogin.client_secret must come from Secrets Manager "
            "(SecretValue.secrets_manager('<secret name>') or a Secret's secret_value): "
            "another SecretValue (unsafe_plain_text, a parameter) would be written into the "
            "template in plain text")


def _image_context() -> str:
    """The function image's build context: only IMAGE_FILES (so nothing else changes its hash),
    staged once per process."""
    target = staging_root() / "dashboard-image"
    if not target.exists():
        for name in IMAGE_FILES:
            source = REPO_ROOT / name
            if source.is_dir():
                shutil.copytree(source, target / name, ignore=IGNORE_CODE)
            else:
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
        shutil.copy2(REPO_ROOT / "lambdas" / "dashboard" / "Dockerfile", target / "Dockerfile")
    return str(target)
