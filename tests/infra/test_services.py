"""Consumers, operations Lambdas, dashboard, pipeline and IAM in the session synth."""

from __future__ import annotations

import json

import pytest

from examples.cdk import EXAMPLE_CONSUMERS
from examples.channels import example_channels
from messenger.emr_step import CODE_PREFIX, emr_package_files
from messenger.jobs.controls import PAUSE_PARTITION
from stacks.bundle import spark_job_scripts
from stacks.emr_pipeline import DATA_PREFIX
from tests.infra.conftest import (
    NAMESPACE,
    CloudAssembly,
    as_list,
    consumer_services,
    policy_statements,
    scaling_policies,
)

SPECS = [level for spec in example_channels(NAMESPACE) for level in spec.level_specs()]


# -- consumers ---------------------------------------------------------------------------------
def test_consumer_tasks_have_health_check_stop_timeout_and_settings(
    assembly: CloudAssembly,
) -> None:
    tasks = assembly.resources("AWS::ECS::TaskDefinition", "examples")
    assert len(tasks) == len(EXAMPLE_CONSUMERS)
    commands = set()
    for task in tasks.values():
        (container,) = task["Properties"]["ContainerDefinitions"]
        assert container["HealthCheck"] == {
            "Command": ["CMD", "check_consumer_health"],
            "Interval": 30, "Timeout": 10, "Retries": 5, "StartPeriod": 300,
        }
        assert container["StopTimeout"] == 120
        assert container["LogConfiguration"]["LogDriver"] == "awslogs"
        env = {e["Name"]: e["Value"] for e in container["Environment"]}
        assert env["MESSENGER_PROVISIONING"] == "verify"
        assert env["MESSENGER_NAMESPACE"] == NAMESPACE
        assert env["MESSENGER_SHUTDOWN_TIMEOUT"] == "30"
        assert int(env["MESSENGER_SHUTDOWN_TIMEOUT"]) < container["StopTimeout"]
        assert env["MESSENGER_CONCURRENCY"] == "1"
        assert "FoundationKey" in json.dumps(env["MESSENGER_KMS_KEY"])
        assert env["MESSENGER_OFFLOAD_BUCKET"] == {"Fn::Join": ["", [
            f"{NAMESPACE}-messenger-offload-", {"Ref": "AWS::AccountId"}, "-",
            {"Ref": "AWS::Region"}]]}
        commands.add(tuple(container["Command"]))
    assert commands == {("messenger", "consume", c) for c in EXAMPLE_CONSUMERS.values()}


def _services(assembly: CloudAssembly) -> dict[str, tuple[str, dict]]:
    """channel -> (its consumer service's logical id, the properties)."""
    services = consumer_services(assembly)
    return {channel: services[consumer] for channel, consumer in EXAMPLE_CONSUMERS.items()}


def test_a_deploy_never_resets_the_task_count(assembly: CloudAssembly) -> None:
    # CloudFormation applies DesiredCount again on every service update (a new image is one):
    # with autoscaling attached the template must not carry it, or a scaled-out fleet drops
    # to it mid-backlog (aws-cdk issue 3919). The scalable target keeps the floor.
    services = _services(assembly)
    assert len(services) == len(EXAMPLE_CONSUMERS)
    targets = assembly.resources("AWS::ApplicationAutoScaling::ScalableTarget", "examples")
    for channel, (service_id, properties) in services.items():
        assert "DesiredCount" not in properties, channel
        (target,) = [t["Properties"] for t in targets.values()
                     if service_id in json.dumps(t["Properties"]["ResourceId"])]
        assert target["ScalableDimension"] == "ecs:service:DesiredCount"
        assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 10)


def test_consumers_track_backlog_per_task_with_metric_math(assembly: CloudAssembly) -> None:
    resources = assembly.template("examples")["Resources"]
    queue_ids = {r["Properties"]["QueueName"]: k for k, r in resources.items()
                 if r["Type"] == "AWS::SQS::Queue"}
    services = _services(assembly)
    tracked = {channel for channel, (service_id, _) in services.items()
               if any(p["PolicyType"] == "TargetTrackingScaling"
                      for p in scaling_policies(assembly, service_id))}
    assert tracked == set(EXAMPLE_CONSUMERS) - {"wishlist_events.mobile_events"}
    for channel in tracked:
        service_id, _ = services[channel]
        (policy,) = [p for p in scaling_policies(assembly, service_id)
                     if p["PolicyType"] == "TargetTrackingScaling"]
        config = policy["TargetTrackingScalingPolicyConfiguration"]
        # The acceptable backlog per task: latency / average processing time x concurrency
        # (orders: 300 s / 2 s; the others: the defaults, 300 s / 1 s)
        assert config["TargetValue"] == (150 if channel == "orders" else 300)
        assert config["ScaleOutCooldown"] == 60
        assert config["DisableScaleIn"] is True  # the gentle step policy scales in
        queries = {q["Id"]: q for q in config["CustomizedMetricSpecification"]["Metrics"]}
        # One query returns data: the backlog (visible + in flight) over the running tasks
        assert [i for i, q in queries.items() if q["ReturnData"]] == ["backlog_per_task"]
        assert queries["backlog_per_task"]["Expression"] == (
            "IF(tasks > 0, (visible0 + inflight0) / tasks, visible0 + inflight0)")
        (spec,) = [s for s in SPECS if s.name == channel]
        for metric_id, name in (("visible0", "ApproximateNumberOfMessagesVisible"),
                                ("inflight0", "ApproximateNumberOfMessagesNotVisible")):
            stat = queries[metric_id]["MetricStat"]
            assert stat["Stat"] == "Maximum"
            assert (stat["Metric"]["Namespace"], stat["Metric"]["MetricName"]) == ("AWS/SQS", name)
            assert stat["Metric"]["Dimensions"] == [{"Name": "QueueName", "Value": {
                "Fn::GetAtt": [queue_ids[spec.queue_name], "QueueName"]}}]
        tasks = queries["tasks"]["MetricStat"]["Metric"]
        assert (tasks["Namespace"], tasks["MetricName"]) == (
            "ECS/ContainerInsights", "RunningTaskCount")
        dimensions = {d["Name"]: d["Value"] for d in tasks["Dimensions"]}
        assert dimensions["ServiceName"] == {"Fn::GetAtt": [service_id, "Name"]}
        assert "Cluster" in json.dumps(dimensions["ClusterName"])


def test_backlog_per_task_scales_in_gently(assembly: CloudAssembly) -> None:
    # Given the default target (300 messages per task) of the all_events consumer
    service_id, _ = _services(assembly)["wishlist_events.all_events"]
    (scale_in,) = [p for p in scaling_policies(assembly, service_id)
                   if p["PolicyType"] == "StepScaling"]
    # Then one scale-in removes a fifth of the tasks, at least one, five minutes apart
    config = scale_in["StepScalingPolicyConfiguration"]
    assert config["AdjustmentType"] == "PercentChangeInCapacity"
    assert config["MinAdjustmentMagnitude"] == 1
    assert config["Cooldown"] == 300
    assert config["StepAdjustments"] == [{"MetricIntervalUpperBound": 0, "ScalingAdjustment": -20}]
    # When backlog per task has stayed below half the target for 15 minutes
    resources = assembly.template("examples")["Resources"]
    (policy_id,) = [k for k, r in resources.items() if r["Properties"] is scale_in]
    (alarm,) = [a["Properties"] for a in resources.values()
                if a["Type"] == "AWS::CloudWatch::Alarm"
                and {"Ref": policy_id} in a["Properties"].get("AlarmActions", [])]
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("LessThanThreshold", 150)
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 15
    assert alarm["TreatMissingData"] == "notBreaching"
    (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
    assert expression["Expression"] == (
        "IF(tasks > 0, (visible0 + inflight0) / tasks, visible0 + inflight0)")
    names = sorted(m["MetricStat"]["Metric"]["MetricName"] for m in alarm["Metrics"]
                   if "MetricStat" in m)
    assert names == ["ApproximateNumberOfMessagesNotVisible",
                     "ApproximateNumberOfMessagesVisible", "RunningTaskCount"]


def test_the_step_policy_stays_available_on_the_backlog_in_flight_included(
    assembly: CloudAssembly,
) -> None:
    service_id, _ = _services(assembly)["wishlist_events.mobile_events"]
    policies = scaling_policies(assembly, service_id)
    assert sorted(p["PolicyType"] for p in policies) == ["StepScaling", "StepScaling"]
    resources = assembly.template("examples")["Resources"]
    queue_ids = {r["Properties"]["QueueName"]: k for k, r in resources.items()
                 if r["Type"] == "AWS::SQS::Queue"}
    policy_ids = {k for k, r in resources.items() if r["Properties"] in policies}
    alarms = [a["Properties"] for a in assembly.resources("AWS::CloudWatch::Alarm",
                                                          "examples").values()
              if {json.dumps(x) for x in a["Properties"].get("AlarmActions", [])}
              & {json.dumps({"Ref": i}) for i in policy_ids}]
    assert sorted(a["Threshold"] for a in alarms) == [0, 100]
    (spec,) = [s for s in SPECS if s.name == "wishlist_events.mobile_events"]
    for alarm in alarms:
        # The alarm's value is visible + not visible (in flight) of the consumer's queue: a
        # task working on a message keeps the backlog above 0, so it is never scaled in
        (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
        inputs = {m["Id"]: m["MetricStat"]["Metric"] for m in alarm["Metrics"]
                  if "MetricStat" in m}
        assert expression["Expression"] == " + ".join(inputs)
        assert sorted(m["MetricName"] for m in inputs.values()) == [
            "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesVisible"]
        (queue,) = {json.dumps(m["Dimensions"][0]["Value"]) for m in inputs.values()}
        assert json.loads(queue)["Fn::GetAtt"][0] == queue_ids[spec.queue_name]


def test_consumers_run_on_spot_when_asked(assembly: CloudAssembly) -> None:
    services = _services(assembly)
    strategies = {channel: properties.get("CapacityProviderStrategy")
                  for channel, (_, properties) in services.items()}
    assert strategies == {
        "wishlist_events.all_events": None,
        "wishlist_events.mobile_events": None,
        "wishlist_events.apple_events": [{"CapacityProvider": "FARGATE_SPOT", "Weight": 1}],
        "orders": [{"CapacityProvider": "FARGATE", "Base": 1, "Weight": 1},
                   {"CapacityProvider": "FARGATE_SPOT", "Weight": 3}],
    }
    for channel, (_, properties) in services.items():
        # A strategy replaces the launch type (ECS rejects both); on-demand keeps FARGATE
        assert ("LaunchType" in properties) == (strategies[channel] is None), channel
    # The platform's cluster offers both Fargate capacity providers
    (association,) = assembly.resources(
        "AWS::ECS::ClusterCapacityProviderAssociations", "platform").values()
    assert sorted(association["Properties"]["CapacityProviders"]) == ["FARGATE", "FARGATE_SPOT"]


def test_a_consumer_may_protect_only_tasks_of_its_own_cluster(assembly: CloudAssembly) -> None:
    resources = assembly.template("examples")["Resources"]
    tasks = [r for r in resources.values() if r["Type"] == "AWS::ECS::TaskDefinition"]
    for task in tasks:
        role_id = task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
        (policy,) = [r for r in resources.values() if r["Type"] == "AWS::IAM::Policy"
                     and {"Ref": role_id} in r["Properties"]["Roles"]]
        (statement,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
                        if "ecs:UpdateTaskProtection" in as_list(s["Action"])]
        assert as_list(statement["Action"]) == ["ecs:UpdateTaskProtection"]
        parts = statement["Resource"]["Fn::Join"][1]
        rendered = "".join(p if isinstance(p, str) else json.dumps(p) for p in parts)
        # arn:<partition>:ecs:<region>:<account>:task/<the platform cluster's name>/*
        assert ":ecs:" in rendered and rendered.endswith("/*")
        assert ":task/" in rendered and "Cluster" in rendered and "ImportValue" in rendered


def test_consumer_grants_are_scoped_to_its_channel(assembly: CloudAssembly) -> None:
    resources = assembly.template("examples")["Resources"]
    queue_ids = {r["Properties"]["QueueName"]: k for k, r in resources.items()
                 if r["Type"] == "AWS::SQS::Queue"}
    tasks = {k: r for k, r in resources.items() if r["Type"] == "AWS::ECS::TaskDefinition"}
    for task in tasks.values():
        (container,) = task["Properties"]["ContainerDefinitions"]
        consumer = container["Command"][2]
        (channel,) = [n for n, c in EXAMPLE_CONSUMERS.items() if c == consumer]
        (spec,) = [s for s in SPECS if s.name == channel]
        role_id = task["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
        (policy,) = [r for r in resources.values() if r["Type"] == "AWS::IAM::Policy"
                     and {"Ref": role_id} in r["Properties"]["Roles"]]
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        receive = [s for s in statements if "sqs:ReceiveMessage" in as_list(s["Action"])]
        assert [s["Resource"] for s in receive] == [
            {"Fn::GetAtt": [queue_ids[spec.queue_name], "Arn"]}
        ]
        # its DLQ (dead letters) and its own queue (a job held back by a flow-control limit,
        # or whose handler raised RateLimited, goes back as a new message: issue 53)
        send = [s for s in statements if "sqs:SendMessage" in as_list(s["Action"])]
        assert sorted(json.dumps(s["Resource"]) for s in send) == sorted(
            json.dumps({"Fn::GetAtt": [queue_ids[name], "Arn"]})
            for name in (spec.queue_name, spec.dlq_name))
        touched = json.dumps(statements)
        others = [q for n, q in queue_ids.items() if n not in (spec.queue_name, spec.dlq_name)]
        assert not any(f'"{other}"' in touched for other in others)


def test_no_iam_statement_allows_every_action(assembly: CloudAssembly) -> None:
    # Resource "*" only where IAM has no resource scope for the action (acknowledged in nag).
    unscoped_allowed = {
        "tag:GetResources", "sns:ListSubscriptions", "cloudwatch:GetMetricData", "sqs:ListQueues",
        "lambda:ListEventSourceMappings",  # no resource types (the pause's mappings)
        "sns:Unsubscribe",  # no resource types in IAM (docs/ops-reports.md)
        "ecr:GetAuthorizationToken", "xray:PutTraceSegments", "xray:PutTelemetryRecords",
        "xray:GetSamplingRules", "xray:GetSamplingTargets",
        "logs:CreateLogDelivery", "logs:GetLogDelivery", "logs:UpdateLogDelivery",
        "logs:DeleteLogDelivery", "logs:ListLogDeliveries", "logs:PutResourcePolicy",
        "logs:DescribeResourcePolicies", "logs:DescribeLogGroups",
        "elasticmapreduce:RunJobFlow", "elasticmapreduce:DescribeCluster",
        "elasticmapreduce:AddTags",
        "elasticmapreduce:TerminateJobFlows",
    }
    statements = policy_statements(assembly)
    assert statements
    for path, statement in statements:
        actions = as_list(statement["Action"])
        assert "*" not in actions, path
        assert not any(a.endswith(":*") for a in actions), (path, actions)
        if "*" in as_list(statement["Resource"]):
            assert set(actions) <= unscoped_allowed, (path, actions)


# -- operations --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "payload", "function"),
    [
        ("rate(15 minutes)", {"scope": "source"}, "QueueAlarm"),
        ("rate(12 hours)", {"scope": "dlq"}, "QueueAlarm"),
        ("rate(1 day)", {}, "ResourceCleaner"),
    ],
)
def test_ops_schedules(
    assembly: CloudAssembly, expression: str, payload: dict, function: str
) -> None:
    rules = [r["Properties"] for r in assembly.resources("AWS::Events::Rule", "platform").values()
             if r["Properties"]["ScheduleExpression"] == expression]
    assert len(rules) == 1
    (target,) = rules[0]["Targets"]
    assert json.loads(target["Input"]) == payload
    assert target["Arn"]["Fn::GetAtt"][0].startswith(f"Ops{function}")


def test_ops_functions_environment_and_bundle(assembly: CloudAssembly) -> None:
    functions = assembly.resources("AWS::Lambda::Function", "platform")
    handlers = {f["Properties"]["Handler"]: f["Properties"] for f in functions.values()}
    assert set(handlers) == {"lambdas.queue_alarm.handler.handler",
                             "lambdas.resource_cleaner.handler.handler"}
    for properties in handlers.values():
        env = properties["Environment"]["Variables"]
        assert env["SLACK_WEBHOOK_SECRET"] == "messenger/slack-webhook"
        assert env["MESSENGER_NAMESPACE"] == NAMESPACE
        assert env["MESSENGER_ALARM_THRESHOLD"] == "100"
        assert env["CLEANER_DRY_RUN"] in ("true", "false")
        assert env["POWERTOOLS_SERVICE_NAME"].startswith("messenger-")
        asset = assembly.outdir / f"asset.{properties['Code']['S3Key'].split('.')[0]}"
        folder = properties["Handler"].split(".")[1]
        for module in (f"lambdas/{folder}/handler.py", "messenger/channel.py",
                       "slack_sdk/__init__.py", "aws_lambda_powertools/__init__.py"):
            assert (asset / module).is_file(), module


def test_ops_permissions_are_limited_to_the_namespace(assembly: CloudAssembly) -> None:
    resources = assembly.template("platform")["Resources"]
    deletes = [s for _, s in policy_statements(assembly)
               if {"sqs:DeleteQueue", "sns:DeleteTopic"} & set(as_list(s["Action"]))]
    assert len(deletes) == 2
    for statement in deletes:
        pattern = json.dumps(statement["Resource"])
        assert f":{NAMESPACE}-*" in pattern
    secrets = [s for _, s in policy_statements(assembly)
               if "secretsmanager:GetSecretValue" in as_list(s["Action"])]
    assert secrets and all("messenger/slack-webhook-" in json.dumps(s["Resource"])
                           for s in secrets)
    # The queue alarm reads queue names, tags, metrics, its secret, its logs and traces; the
    # only writes put back what a deploy undid of a pause: a paused queue's tag, a consumer
    # mapping disabled again, after reading the pause records (their partition only). Its
    # 15-minute run also sweeps the workflows (issue 52): the workflows table's items and the
    # status table's, large results read, and a held job released to a queue or topic of the
    # namespace only (by its tags), nothing deleted.
    (alarm_policy,) = [r for k, r in resources.items()
                       if k.startswith("OpsQueueAlarmRoleDefaultPolicy")]
    alarm_statements = alarm_policy["Properties"]["PolicyDocument"]["Statement"]
    actions = {a for s in alarm_statements for a in as_list(s["Action"])}
    assert {a.split(":")[0] for a in actions} == {
        "sqs", "sns", "s3", "tag", "cloudwatch", "secretsmanager", "logs", "xray", "dynamodb",
        "lambda", "kms"
    }
    assert {a for a in actions if a.startswith(("sqs:", "sns:"))} == {
        "sqs:ListQueues", "sqs:GetQueueUrl", "sqs:GetQueueAttributes", "sqs:ListQueueTags",
        "sqs:TagQueue", "sqs:SendMessage", "sns:Publish", "sns:GetTopicAttributes"}
    for statement in alarm_statements:
        if {"sqs:SendMessage", "sns:Publish"} & set(as_list(statement["Action"])):
            assert NAMESPACE in json.dumps(statement["Condition"]), statement
    assert {a for a in actions if a.startswith("s3:")} <= {"s3:GetObject", "s3:ListBucket"}
    assert {a for a in actions if a.startswith("dynamodb:")} == {
        "dynamodb:Query", "dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:PutItem",
        "dynamodb:UpdateItem", "dynamodb:BatchGetItem", "dynamodb:BatchWriteItem"}
    assert not any("Delete" in a or "Untag" in a for a in actions)
    by_sid = {s.get("Sid"): s for s in alarm_statements}
    assert by_sid["ReadPauseRecords"]["Condition"] == {"ForAllValues:StringEquals": {
        "dynamodb:LeadingKeys": [PAUSE_PARTITION]}}
    assert "lambda:FunctionArn" in json.dumps(by_sid["ReapplyLambdaConsumerPauses"]["Condition"])


# -- dashboard and pipeline --------------------------------------------------------------------
def test_dashboard_shows_depth_age_and_dlq_depth_per_channel(assembly: CloudAssembly) -> None:
    (dashboard,) = assembly.resources("AWS::CloudWatch::Dashboard", "examples").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for spec in SPECS:
        for title in (": depth", ": age of oldest message", ": DLQ depth"):
            assert f"{spec.name}{title}" in body
    assert body.count("ApproximateAgeOfOldestMessage") == len(SPECS)
    assert body.count("ApproximateNumberOfMessagesVisible") == 2 * len(SPECS)


def test_pipeline_provides_code_bucket_roles_and_job_runner(assembly: CloudAssembly) -> None:
    template = assembly.template("pipeline")
    assert {"CodeBucketName", "JobRoleArn", "InstanceProfileName", "StateMachineArn"} <= set(
        template["Outputs"]
    )
    (machine,) = assembly.resources("AWS::StepFunctions::StateMachine", "pipeline").values()
    definition = json.dumps(machine["Properties"]["DefinitionString"])
    for resource in ("createCluster.sync", "addStep.sync", "terminateCluster"):
        assert resource in definition
    job_policy = [s for _, s in policy_statements(assembly)
                  if "sns:Publish" in as_list(s["Action"])]
    assert job_policy, "the EMR job role may publish to the example exchange"
    profiles = assembly.resources("AWS::IAM::InstanceProfile", "pipeline")
    assert len(profiles) == 1
    # The --py-files bundle: the same part of messenger as `emr submit` ships, and the jobs;
    # nothing else (boto3 ships with EMR; tests/unit/test_emr_python.py imports it that way).
    libraries = [p for p in assembly.outdir.glob("asset.*") if (p / "spark_jobs").is_dir()]
    assert len(libraries) == 1
    shipped = sorted(p.relative_to(libraries[0]).as_posix()
                     for p in libraries[0].rglob("*") if p.is_file())
    assert [p for p in shipped if not p.startswith("spark_jobs/")] == [
        name for name, _ in emr_package_files()
    ]


def _state_machine_definition(assembly: CloudAssembly) -> dict:
    (machine,) = assembly.resources("AWS::StepFunctions::StateMachine", "pipeline").values()
    parts = machine["Properties"]["DefinitionString"]["Fn::Join"][1]
    return json.loads("".join(p if isinstance(p, str) else "TOKEN" for p in parts))


def test_state_machine_runs_each_job_on_a_transient_cluster(assembly: CloudAssembly) -> None:
    states = _state_machine_definition(assembly)["States"]
    jobs = sorted(p.stem for p in spark_job_scripts())
    assert jobs, "spark_jobs/ holds at least one job"
    # An unknown job name fails with the allowed names
    choices = states["WhichJob"]["Choices"]
    assert sorted(c["StringEquals"] for c in choices) == jobs
    assert states[states["WhichJob"]["Default"]]["Cause"].endswith(", ".join(jobs))
    # The step: spark-submit with the settings, then the script and the input's args
    submit = states["SparkSubmit"]["Result"]
    assert submit[:3] == ["spark-submit", "--deploy-mode", "cluster"]
    assert "spark.executorEnv.MESSENGER_PROVISIONING=verify" in submit
    assert f"spark.yarn.appMasterEnv.MESSENGER_NAMESPACE={NAMESPACE}" in submit
    run = states["RunJob"]
    assert run["QueryLanguage"] == "JSONata"
    assert run["Arguments"]["Step"]["HadoopJarStep"]["Args"] == (
        "{% $append($append($states.input.submit, [$states.input.script]), "
        "$exists($states.input.args) ? $states.input.args : []) %}"
    )
    # The cluster is terminated after success and after failure
    assert states[run["Next"]]["Resource"].endswith("terminateCluster.sync")
    (catch,) = run["Catch"]
    assert "$states.input" in catch["Output"]
    assert states[catch["Next"]]["Resource"].endswith("terminateCluster.sync")


def test_code_bucket_expires_only_uploaded_code(assembly: CloudAssembly) -> None:
    # The documented job input and output live under data/ in the code bucket: they must stay
    buckets = assembly.resources("AWS::S3::Bucket", "pipeline")
    (code,) = [b for b in buckets.values()
               if "KMSMasterKeyID" in json.dumps(b["Properties"].get("BucketEncryption", {}))]
    rules = code["Properties"]["LifecycleConfiguration"]["Rules"]
    expiring = [r for r in rules if "ExpirationInDays" in r]
    assert [r.get("Prefix") for r in expiring] == [f"{CODE_PREFIX}/"]  # what emr submit writes
    assert DATA_PREFIX != f"{CODE_PREFIX}/"


def test_example_consumers_run_their_own_code_on_a_pinned_platform(
    assembly: CloudAssembly,
) -> None:
    # One image for the four example services: the library and examples/, for linux/amd64
    manifest = json.loads((assembly.outdir / f"{NAMESPACE}-MessengerExamples.assets.json")
                          .read_text())
    (image,) = manifest["dockerImages"].values()
    assert image["source"]["dockerBuildArgs"] == {"APP_DIR": "examples"}
    assert image["source"]["platform"] == "linux/amd64"
    context = assembly.outdir / image["source"]["directory"]
    assert (context / "examples" / "wishlist.py").is_file()
    assert (context / "messenger" / "consume" / "consumer.py").is_file()
    for task in assembly.resources("AWS::ECS::TaskDefinition", "examples").values():
        assert task["Properties"]["RuntimePlatform"]["CpuArchitecture"] == "X86_64"
