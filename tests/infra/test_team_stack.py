"""A team's own stack, built exactly as the CDK guide shows (one in-process synth per session):
its code folder lives outside the repository and outside `examples/`."""

from __future__ import annotations

from typing import Any

from tests.infra.conftest import ACCOUNT, REGION, TEAM_NAMESPACE, TeamApp

STACK = f"{TEAM_NAMESPACE}-Payments"
PLATFORM = f"{TEAM_NAMESPACE}-MessengerPlatform"


def _resources(team_app: TeamApp, resource_type: str) -> list[dict[str, Any]]:
    return [r for r in team_app.templates[STACK]["Resources"].values()
            if r["Type"] == resource_type]


def test_the_team_stack_synthesizes_beside_the_platform_and_examples(team_app: TeamApp) -> None:
    assert set(team_app.templates) == {
        PLATFORM, f"{TEAM_NAMESPACE}-MessengerExamples", STACK,
    }
    (queue,) = [q for q in _resources(team_app, "AWS::SQS::Queue")
                if q["Properties"]["QueueName"] == f"{TEAM_NAMESPACE}-payments"]
    assert queue["Properties"]["VisibilityTimeout"] == 120


def test_the_image_asset_holds_the_team_code_and_the_library(team_app: TeamApp) -> None:
    # Given the team's folder, written from the CDK guide outside the repository
    consumers = team_app.folder / "payments" / "consumers.py"
    assert consumers.is_file()
    # When the stack is synthesized, Then its one image asset is built from the consumer
    # Dockerfile with APP_DIR=payments, for linux/amd64
    (image,) = team_app.assets(STACK)["dockerImages"].values()
    source = image["source"]
    assert source["dockerFile"] == "consumer_image/Dockerfile"
    assert source["dockerBuildArgs"] == {"APP_DIR": "payments"}
    assert source["platform"] == "linux/amd64"
    # And the staged build context holds that code, the library and the pinned requirements
    context = team_app.outdir / source["directory"]
    assert (context / "payments" / "consumers.py").read_text() == consumers.read_text()
    for path in ("consumer_image/Dockerfile", "consumer_image/entrypoint.sh",
                 "messenger/consume/consumer.py", "pyproject.toml", "requirements.txt"):
        assert (context / path).is_file(), path
    assert not list(context.rglob("__pycache__"))
    # Only what the Dockerfile copies: the local build tools never change the asset's hash
    assert sorted(p.name for p in (context / "consumer_image").iterdir()) == [
        "Dockerfile", "entrypoint.sh",
    ]


def test_the_task_runs_the_team_class_on_the_image_platform(team_app: TeamApp) -> None:
    (task,) = _resources(team_app, "AWS::ECS::TaskDefinition")
    properties = task["Properties"]
    assert properties["RuntimePlatform"] == {
        "CpuArchitecture": "X86_64", "OperatingSystemFamily": "LINUX",
    }
    (container,) = properties["ContainerDefinitions"]
    assert container["Command"] == ["messenger", "consume", "payments.consumers:PaymentConsumer"]
    (image,) = team_app.assets(STACK)["dockerImages"]
    assert image in str(container["Image"])


def test_the_team_stack_deploys_where_the_platform_does(team_app: TeamApp) -> None:
    # The CDK guide's ChannelStack passes no env: it inherits the platform's, so the cross-stack
    # references to the platform key and cluster are legal.
    assert team_app.environments[STACK] == team_app.environments[PLATFORM] == (
        f"aws://{ACCOUNT}/{REGION}"
    )
    imports = str(team_app.templates[STACK])
    assert "Fn::ImportValue" in imports and "FoundationKey" in imports
