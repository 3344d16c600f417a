"""The synth-time topology lint: one error per finding, naming the construct and the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs

from messenger.channel import ChannelSpec
from stacks.channel import Channel
from stacks.channel_stack import ChannelStack
from stacks.config import MessengerConfig
from stacks.consumer_image import ConsumerImage, ConsumerImageError
from stacks.consumer_service import ConsumerService
from stacks.foundation import Foundation
from stacks.platform_stack import PlatformStack
from tests.infra.conftest import ACCOUNT, REGION

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
ENV = cdk.Environment(account=ACCOUNT, region=REGION)

CONSUMERS = '''
from messenger import Consumer


class OrderConsumer(Consumer):
    channel = "orders"
    processing_timeout = 30

    def handler(self, message):
        pass


class OrderedConsumer(OrderConsumer):
    ordered = True


class PaymentsConsumer(OrderConsumer):
    channel = "payments"


class SlowConsumer(OrderConsumer):
    processing_timeout = 90


class NoHandler(Consumer):
    channel = "orders"
'''


def _app(outdir: Path) -> cdk.App:
    return cdk.App(outdir=str(outdir), context=CONTEXT)


def _errors(app: cdk.App) -> list[str]:
    """The validation errors of a failing synthesis, one per line: '[path] message'."""
    with pytest.raises(Exception, match="Validation failed") as failure:
        app.synth()
    return [line.strip() for line in str(failure.value).splitlines()
            if line.strip().startswith("[")]


@pytest.fixture
def service_code(tmp_path: Path) -> Path:
    """A team's code folder outside the repository: package `ordersvc`."""
    folder = tmp_path / "code" / "ordersvc"
    folder.mkdir(parents=True)
    (folder / "consumers.py").write_text(CONSUMERS)
    return folder


def _consumers(tmp_path: Path, code: Path, *targets: tuple[str, dict]) -> cdk.App:
    app = _app(tmp_path / "out")
    stack = cdk.Stack(app, "Svc", env=ENV)
    foundation = Foundation(stack, "Foundation", namespace="t")
    orders = Channel(stack, "Orders", spec=ChannelSpec("orders", namespace="t"),
                     key=foundation.key)
    cluster = ecs.Cluster(stack, "Cluster", vpc=ec2.Vpc(
        stack, "Vpc", nat_gateways=0, availability_zones=[f"{REGION}a"]),
        container_insights_v2=ecs.ContainerInsights.ENABLED)
    image = ConsumerImage.from_code(code)
    for index, (target, options) in enumerate(targets):
        ConsumerService(stack, f"Consumer{index}", channel=orders, foundation=foundation,
                        cluster=cluster, image=image, consumer_class=target, namespace="t",
                        **options)
    return app


def test_a_consistent_consumer_from_its_own_folder_synthesizes(
    tmp_path: Path, service_code: Path
) -> None:
    app = _consumers(tmp_path, service_code, ("ordersvc.consumers:OrderConsumer", {}))
    template = app.synth().get_stack_by_name("Svc").template
    (task,) = [r for r in template["Resources"].values()
               if r["Type"] == "AWS::ECS::TaskDefinition"]
    (container,) = task["Properties"]["ContainerDefinitions"]
    assert container["Command"][-1] == "ordersvc.consumers:OrderConsumer"


def test_each_bad_consumer_is_one_error_naming_its_construct_and_the_fix(
    tmp_path: Path, service_code: Path
) -> None:
    # Given five services on the channel 'orders', each wrong in one way
    app = _consumers(
        tmp_path, service_code,
        ("ordersvc.consumers:Missing", {}),
        ("ordersvc.nothere:OrderConsumer", {}),
        ("ordersvc.consumers:OrderedConsumer", {}),
        ("ordersvc.consumers:PaymentsConsumer", {}),
        ("ordersvc.consumers:OrderConsumer", {"processing_timeout": cdk.Duration.seconds(45)}),
        ("ordersvc.consumers:NoHandler", {}),
        ("billing.consumers:OrderConsumer", {}),
    )
    # When synthesized, Then each is one error on its own construct
    errors = _errors(app)
    assert len(errors) == 7, errors
    by_path = {re.match(r"\[([^\]]+)\]", e).group(1): e for e in errors}
    assert "cannot be loaded" in by_path["Svc/Consumer0"]
    assert "ordersvc.consumers:Missing" in by_path["Svc/Consumer0"]
    assert "No module named 'ordersvc.nothere'" in by_path["Svc/Consumer1"]
    assert "declares ordered=True but is deployed for channel 'orders' with ordered=False" \
        in by_path["Svc/Consumer2"]
    assert "declares channel='payments' but is deployed for channel 'orders'" \
        in by_path["Svc/Consumer3"]
    assert "processing_timeout (45 s) differs from ordersvc.consumers:OrderConsumer" \
        ".processing_timeout (30 s)" in by_path["Svc/Consumer4"]
    assert "does not define handler" in by_path["Svc/Consumer5"]
    assert "is not in its image" in by_path["Svc/Consumer6"]
    assert "Name the class 'ordersvc.<module>:<Class>'" in by_path["Svc/Consumer6"]
    for error in errors:
        assert any(fix in error for fix in ("Fix ", "Make ", "drop the argument", "Name the"))


def test_the_class_processing_timeout_must_fit_the_visibility_timeout(
    tmp_path: Path, service_code: Path
) -> None:
    # Given a class that may process a message for 90 s on a channel with a 60 s visibility
    app = _consumers(tmp_path, service_code, ("ordersvc.consumers:SlowConsumer", {}))
    (error,) = _errors(app)
    assert error.startswith("[Svc/Consumer0]")
    assert "visibility_timeout (60 s) is shorter than the consumer's processing_timeout (90 s)" \
        in error


def test_physical_name_collisions_across_stacks_are_one_error_per_pair(tmp_path: Path) -> None:
    # Given channels in two stacks of one account and region
    app = _app(tmp_path)
    first = cdk.Stack(app, "First", env=ENV)
    second = cdk.Stack(app, "Second", env=ENV)
    key = Foundation(first, "Foundation", namespace="x").key
    Channel(first, "Payments", spec=ChannelSpec("payment_events.audit_log", namespace="x"),
            key=key)
    Channel(second, "OrdersAudit", spec=ChannelSpec("order_events.audit_log", namespace="x"),
            key=key)
    Channel(first, "Orders", spec=ChannelSpec("orders", namespace="x"), key=key)
    Channel(second, "OrdersDlq", spec=ChannelSpec("orders-dlq", namespace="x"), key=key)
    # and the same names in another region (no collision there)
    Channel(cdk.Stack(app, "Elsewhere", env=cdk.Environment(account=ACCOUNT, region="us-east-1")),
            "Orders", spec=ChannelSpec("orders", namespace="x"),
            key=Foundation(app.node.find_child("Elsewhere"), "Foundation", namespace="x").key)
    errors = _errors(app)
    # Then: audit_log (queue and DLQ) is one finding, orders-dlq another
    assert len(errors) == 2, errors
    audit, dlq = sorted(errors)
    assert audit.startswith("[Second/OrdersAudit/Queue] channel 'order_events.audit_log' "
                            "collides with channel 'payment_events.audit_log' (First/Payments")
    assert "queue 'x-audit_log'" in audit and "queue 'x-audit_log-dlq'" in audit
    assert "Rename one of the channels, or deploy them in different namespaces" in audit
    assert dlq.startswith("[Second/OrdersDlq/Queue] channel 'orders-dlq' collides with "
                          "channel 'orders'")
    assert "its queue and the dead-letter queue of channel 'orders' are both queue " \
           "'x-orders-dlq'" in dlq


def test_an_exchange_with_ordered_and_unordered_channels_fails(tmp_path: Path) -> None:
    app = _app(tmp_path)
    stack = cdk.Stack(app, "Events", env=ENV)
    key = Foundation(stack, "Foundation", namespace="x").key
    Channel(stack, "One", spec=ChannelSpec("ev.one", namespace="x", ordered=True), key=key)
    Channel(stack, "Two", spec=ChannelSpec("ev.two", namespace="x"), key=key)
    Channel(stack, "Three", spec=ChannelSpec("ev.three", namespace="x"), key=key)
    (error,) = _errors(app)
    assert error.startswith("[Events/ExchangeEv]")
    assert "has ordered channels (ev.one) and unordered channels (ev.three, ev.two)" in error
    assert "Give every channel of the exchange the same ChannelSpec.ordered" in error


def test_two_namespaces_never_share_an_exchange_topic(tmp_path: Path) -> None:
    # Given prod and staging channels of one exchange, in one stack and across stacks
    app = _app(tmp_path)
    prod = cdk.Stack(app, "Prod", env=ENV)
    staging = cdk.Stack(app, "Staging", env=ENV)
    both = cdk.Stack(app, "Both", env=ENV)
    prod_key = Foundation(prod, "Foundation", namespace="prod").key
    staging_key = Foundation(staging, "Foundation", namespace="staging").key
    Channel(prod, "A", spec=ChannelSpec("events.a", namespace="prod"), key=prod_key)
    Channel(staging, "A", spec=ChannelSpec("events.a", namespace="staging"), key=staging_key)
    Channel(both, "ProdB", spec=ChannelSpec("events.b", namespace="prod"), key=prod_key)
    Channel(both, "StagingB", spec=ChannelSpec("events.b", namespace="staging"),
            key=staging_key)
    Channel(both, "StagingC", spec=ChannelSpec("events.c", namespace="staging"),
            key=staging_key)
    assembly = app.synth()
    # Then each namespace has its own topic, and every queue subscribes to its namespace's
    topics, subscriptions = {}, []
    for name in ("Prod", "Staging", "Both"):
        template = assembly.get_stack_by_name(name).template
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] == "AWS::SNS::Topic":
                topics[(name, logical_id)] = resource["Properties"]["TopicName"]
            if resource["Type"] == "AWS::SNS::Subscription":
                queue = template["Resources"][resource["Properties"]["Endpoint"]["Fn::GetAtt"][0]]
                subscriptions.append((name, queue["Properties"]["QueueName"],
                                      json.dumps(resource["Properties"]["TopicArn"])))
    assert sorted(topics.values()) == ["prod-events", "staging-events"]
    assert len(subscriptions) == 5
    for stack, queue, topic_arn in subscriptions:
        namespace = queue.split("-")[0]
        (topic_stack, topic_id), = [k for k, v in topics.items() if v == f"{namespace}-events"]
        if topic_stack == stack:
            assert topic_id in topic_arn, (stack, queue, topic_arn)
        else:  # by its name in another stack, never an export
            assert json.loads(topic_arn) == f"arn:aws:sns:{REGION}:{ACCOUNT}:{namespace}-events"
    dependencies = {name: {d.id for d in assembly.get_stack_by_name(name).dependencies
                           if not d.id.endswith(".assets")}
                    for name in ("Prod", "Staging", "Both")}
    assert dependencies == {"Prod": set(), "Staging": set(), "Both": {"Prod", "Staging"}}


# -- the user-facing errors of stacks and images ---------------------------------------------
def test_a_channel_stack_deploys_where_its_platform_does(tmp_path: Path) -> None:
    app = _app(tmp_path)
    platform = PlatformStack(app, "Platform", config=MessengerConfig(namespace="p"), env=ENV)
    stack = ChannelStack(app, "Team", platform=platform)
    assert stack.resolve(stack.account) == ACCOUNT and stack.region == REGION
    with pytest.raises(ValueError, match="differs from the platform's .* Leave env out"):
        ChannelStack(app, "Other", platform=platform,
                     env=cdk.Environment(account=ACCOUNT, region="us-east-1"))
    channel = stack.add_channel(ChannelSpec("orders"))
    with pytest.raises(ValueError, match=r"needs the service's code: ChannelStack\(\.\.\., code="):
        stack.add_consumer(channel, "orders.consumers:OrderConsumer")


@pytest.mark.parametrize(
    ("folder", "message"),
    [
        ("orders-service", "must be a Python identifier; rename it \\(e.g. 'orders_service'\\)"),
        ("messenger", "would shadow the library"),
    ],
)
def test_a_code_folder_must_be_a_package_name(tmp_path: Path, folder: str, message: str) -> None:
    (tmp_path / folder).mkdir()
    with pytest.raises(ConsumerImageError, match=message):
        ConsumerImage.from_code(tmp_path / folder)


def test_a_code_folder_must_exist_and_have_one_requirements_file(tmp_path: Path) -> None:
    with pytest.raises(ConsumerImageError, match="is not a folder"):
        ConsumerImage.from_code(tmp_path / "missing")
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "requirements.txt").write_text("requests==2.32.3\n")
    (tmp_path / "other.txt").write_text("")
    with pytest.raises(ConsumerImageError, match="has its own requirements.txt"):
        ConsumerImage.from_code(tmp_path / "svc", requirements=tmp_path / "other.txt")
    image = ConsumerImage.from_code(tmp_path / "svc")
    assert image.requirements == (tmp_path / "svc" / "requirements.txt").resolve()
