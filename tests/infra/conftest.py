"""One real `cdk synth` per session (the pinned CLI, `node_modules/.bin/cdk`), shared by the tests.

The CLI runs the app exactly as a user does (cdk.json), offline: no Docker, no AWS credentials,
a fixed account/region so physical names and ARNs are concrete. CloudFormation's built-in
validation plugin is switched off here (CDK_VALIDATION=false, 20-30 s) because
`test_templates.py` runs cfn-lint on every template; cdk-nag runs as in `make synth`.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.docs import code_blocks, doc_text

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"
REGION = "eu-west-1"
NAMESPACE = "itest"
STACKS = {
    "platform": f"{NAMESPACE}-MessengerPlatform",
    "examples": f"{NAMESPACE}-MessengerExamples",
    "pipeline": f"{NAMESPACE}-MessengerPipeline",
}


@dataclass
class CloudAssembly:
    """The synthesized cloud assembly: templates by stack name, the CLI's output."""

    outdir: Path
    output: str
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    _asserting: dict[str, Any] = field(default_factory=dict)

    def template(self, stack: str) -> dict[str, Any]:
        return self.templates[STACKS.get(stack, stack)]

    def assertions(self, stack: str) -> Any:
        """`aws_cdk.assertions.Template` of one stack (made once)."""
        from aws_cdk.assertions import Template

        name = STACKS.get(stack, stack)
        if name not in self._asserting:
            self._asserting[name] = Template.from_json(self.templates[name])
        return self._asserting[name]

    def resources(self, resource_type: str, stack: str | None = None) -> dict[str, dict]:
        """Resources of one type (logical id -> resource), in one stack or all."""
        names = [STACKS.get(stack, stack)] if stack else list(self.templates)
        return {
            f"{name}/{logical_id}": resource
            for name in names
            for logical_id, resource in self.templates[name]["Resources"].items()
            if resource["Type"] == resource_type
        }


def cli_environment() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AWS_", "CDK_")) or key in ("AWS_CA_BUNDLE",)
    }
    env.update(
        CDK_DEFAULT_ACCOUNT=ACCOUNT,
        CDK_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        AWS_DEFAULT_REGION=REGION,
        CDK_VALIDATION="false",
        CDK_DISABLE_CLI_TELEMETRY="true",
        JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1",
    )
    return env


@pytest.fixture(scope="session")
def assembly(tmp_path_factory: pytest.TempPathFactory) -> CloudAssembly:
    outdir = tmp_path_factory.mktemp("cdk.out")
    cli = REPO / "node_modules" / ".bin" / "cdk"
    if not cli.exists():
        pytest.fail("the CDK CLI is not installed: run `npm install` (make test does)")
    command = [
        str(cli), "synth", "--quiet", "--no-notices", "-o", str(outdir),
        "-c", f"messenger:namespace={NAMESPACE}",
    ]
    result = subprocess.run(
        command, cwd=REPO, env=cli_environment(), capture_output=True, text=True, timeout=600
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        pytest.fail(f"cdk synth failed ({result.returncode}):\n{output[-6000:]}")
    synthesized = CloudAssembly(outdir=outdir, output=output)
    for path in outdir.glob("*.template.json"):
        synthesized.templates[path.name.removesuffix(".template.json")] = json.loads(
            path.read_text()
        )
    return synthesized


def policy_statements(assembly: CloudAssembly) -> list[tuple[str, dict[str, Any]]]:
    """Every IAM policy statement of every template, with its policy's path."""
    found = []
    for path, policy in assembly.resources("AWS::IAM::Policy").items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            found.append((path, statement))
    return found


def consumer_services(assembly: CloudAssembly) -> dict[str, tuple[str, dict]]:
    """consumer class -> (its service's logical id, the properties), in the examples stack."""
    resources = assembly.template("examples")["Resources"]
    by_task = {}
    for logical_id, resource in resources.items():
        if resource["Type"] == "AWS::ECS::Service":
            by_task[resource["Properties"]["TaskDefinition"]["Ref"]] = (
                logical_id, resource["Properties"])
    found = {}
    for task_id, (service_id, properties) in by_task.items():
        (container,) = resources[task_id]["Properties"]["ContainerDefinitions"]
        found[container["Command"][2]] = (service_id, properties)
    return found


def scaling_policies(assembly: CloudAssembly, service_id: str) -> list[dict]:
    """The scaling policies on `service_id`'s scalable target."""
    resources = assembly.template("examples")["Resources"]
    (target_id,) = [k for k, r in resources.items()
                    if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"
                    and service_id in json.dumps(r["Properties"]["ResourceId"])]
    return [r["Properties"] for r in resources.values()
            if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy"
            and r["Properties"].get("ScalingTargetId") == {"Ref": target_id}]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# -- documentation snippets ----------------------------------------------------------------------
#: The page whose code blocks a team copies to add its own stack (tests/infra/test_readme.py).
CDK_GUIDE = "docs/cdk-guide.md"


@dataclass
class TeamApp:
    """The app as a team extends it from the CDK guide: its folder, the synthesized assembly."""

    folder: Path
    outdir: Path
    templates: dict[str, dict[str, Any]]
    manifest: dict[str, Any]
    environments: dict[str, str]

    def assets(self, stack: str) -> dict[str, Any]:
        return json.loads((self.outdir / f"{stack}.assets.json").read_text())


TEAM_NAMESPACE = "team"


@pytest.fixture(scope="session")
def team_app(tmp_path_factory: pytest.TempPathFactory) -> TeamApp:
    """The CDK guide's snippets run exactly as written, once per session, in process.

    Blocks starting with `# <folder>/<file>.py` are the team's files, written to a fresh folder
    outside the repository; the block starting with `# app.py` is what the team adds to
    `app.py`'s `main()`, run after `build_app` with `app` and `platform` bound as there. The
    environment is the one the CLI gives with credentials (account and region)."""
    import aws_cdk as cdk

    from app import read_config
    from examples.cdk import add_example_channels
    from stacks.messenger_app import build_app

    folder = tmp_path_factory.mktemp("team")
    fragments = []
    for block in code_blocks(doc_text(CDK_GUIDE), "python"):
        first = block.splitlines()[0]
        path = first.removeprefix("# ").split(",")[0].split()[0]
        if path == "app.py":
            fragments.append(block)
        else:
            assert first.startswith("# ") and path.endswith(".py"), first
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(block)
    assert len(fragments) == 1, "the CDK guide shows one addition to app.py"
    context = json.loads((REPO / "cdk.json").read_text())["context"]
    context.update({"messenger:namespace": TEAM_NAMESPACE, "messenger:pipeline": "false"})
    outdir = folder / "cdk.out"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # where `cdk` runs: relative code folders resolve here
        patch.setenv("CDK_DEFAULT_ACCOUNT", ACCOUNT)
        patch.setenv("CDK_DEFAULT_REGION", REGION)
        app = cdk.App(outdir=str(outdir), context=context)
        platform = build_app(app, read_config(app), channels=add_example_channels).platform
        exec(compile(fragments[0], f"{CDK_GUIDE} (app.py)", "exec"),  # noqa: S102
             {"__name__": "app_main", "app": app, "platform": platform})
        assembly = app.synth()
    templates = {stack.stack_name: stack.template for stack in assembly.stacks}
    manifest = json.loads((outdir / "manifest.json").read_text())
    environments = {
        stack.stack_name: f"aws://{stack.environment.account}/{stack.environment.region}"
        for stack in assembly.stacks
    }
    return TeamApp(folder, outdir, templates, manifest, environments)
