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


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
