"""A team's consumer that imports a package of its own requirements, absent where synth runs.

The lint imports consumer classes at synth; `humanize` is in the team's requirements.txt (the
image installs it) but not in the CDK's environment. Each test synthesizes one small app in
process (seconds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecs as ecs

from messenger.channel import ChannelSpec
from stacks.channel import Channel
from stacks.consumer_image import ConsumerImage
from stacks.consumer_service import ConsumerService
from stacks.foundation import Foundation
from tests.infra.conftest import ACCOUNT, REGION

REPO = Path(__file__).resolve().parents[2]
CONTEXT = json.loads((REPO / "cdk.json").read_text())["context"]
CONSUMERS = '''
import humanize
from humanize import naturalsize

from messenger import Consumer


class ReportConsumer(Consumer):
    channel = "reports"
    processing_timeout = 90

    @humanize.wrapped_by_something(retries=3)
    def handler(self, message):
        print("report of", naturalsize(len(message.body)))


class MisnamedConsumer(Consumer):
    channel = "report"  # not the channel it is deployed for

    def handler(self, message):
        print(humanize.intcomma(1000))
'''


def _team_folder(tmp_path: Path, requirements: str) -> Path:
    folder = tmp_path / "reporting"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "consumers.py").write_text(CONSUMERS)
    (folder / "requirements.txt").write_text(requirements)
    return folder


def _synth(tmp_path: Path, folder: Path, consumer_class: str) -> Any:
    app = cdk.App(outdir=str(tmp_path / "cdk.out"), context=CONTEXT,
                  builtin_cloud_formation_validation=False)
    stack = cdk.Stack(app, "Team", env=cdk.Environment(account=ACCOUNT, region=REGION))
    foundation = Foundation(stack, "Foundation", namespace="team")
    channel = Channel(stack, "Reports", key=foundation.key,
                      spec=ChannelSpec("reports", namespace="team", visibility_timeout=120))
    cluster = ecs.Cluster(stack, "Cluster", vpc=ec2.Vpc(stack, "Vpc", nat_gateways=0,
                                                          availability_zones=["eu-west-1a"]),
                          container_insights_v2=ecs.ContainerInsights.ENABLED)
    ConsumerService(stack, "Consumer", channel=channel, foundation=foundation, cluster=cluster,
                    image=ConsumerImage.from_code(folder), consumer_class=consumer_class,
                    namespace="team")
    return app.synth().get_stack_by_name("Team")


def test_a_consumer_importing_a_package_of_its_requirements_synthesizes(
    tmp_path: Path,
) -> None:
    with pytest.raises(ModuleNotFoundError):
        import humanize  # noqa: F401  the premise: the CDK's environment lacks it
    # Given the team's folder, whose requirements name humanize
    folder = _team_folder(tmp_path, "humanize==4.12.1  # sizes in reports\n")
    # When its consumer is synthesized
    stack = _synth(tmp_path, folder, "reporting.consumers:ReportConsumer")
    # Then synthesis succeeds with one warning line naming the absent package
    warnings = [m.entry.data for m in stack.messages if m.entry.type == "aws:cdk:warning"]
    ours = [w for w in warnings if "humanize" in str(w)]
    assert len(ours) == 1, warnings
    assert "\n" not in str(ours[0])
    assert "'reporting.consumers:ReportConsumer' checked without humanize" in str(ours[0])
    # And the task runs the class
    tasks = [r for r in stack.template["Resources"].values()
             if r["Type"] == "AWS::ECS::TaskDefinition"]
    (container,) = tasks[0]["Properties"]["ContainerDefinitions"]
    assert container["Command"][-1] == "reporting.consumers:ReportConsumer"


def test_the_checks_that_need_no_package_still_run(tmp_path: Path) -> None:
    # Given a class importing humanize that declares another channel than it is deployed for
    folder = _team_folder(tmp_path, "humanize\n")
    # Then the channel check still fails synthesis, naming both names
    with pytest.raises(Exception, match=r"declares channel='report' but is deployed for "
                                        r"channel 'reports'"):
        _synth(tmp_path, folder, "reporting.consumers:MisnamedConsumer")


def test_a_module_no_requirement_provides_is_still_an_error(tmp_path: Path) -> None:
    # Given requirements that do not name humanize (left out, or a typo)
    folder = _team_folder(tmp_path, "requests==2.32.3\n")
    with pytest.raises(Exception, match=r"No module named 'humanize'.*belongs in "
                                        r"reporting/requirements.txt"):
        _synth(tmp_path, folder, "reporting.consumers:ReportConsumer")
