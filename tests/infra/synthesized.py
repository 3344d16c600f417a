"""An app synthesized with cdk-nag, its templates and findings, for the infra tests that build
their own app (one synth per session each)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk.assertions import Template


@dataclass
class Synthesized:
    templates: dict[str, dict[str, Any]]
    violations: list[tuple[str, list[str]]]  # cdk-nag: rule, constructs

    def template(self, stack: str) -> Template:
        return Template.from_json(self.templates[stack])

    def of_type(self, stack: str, kind: str) -> dict[str, dict[str, Any]]:
        return {k: r for k, r in self.templates[stack]["Resources"].items() if r["Type"] == kind}


def synthesize(app: cdk.App, outdir: Path) -> Synthesized:
    """Synthesize `app` (made with `outdir` and cdk-nag's checks added): its templates and the
    nag's findings; a synthesis that fails is one finding, 'synthesis failed', with its error."""
    failure = ""
    try:
        assembly = app.synth()
        templates = {s.stack_name: s.template for s in assembly.stacks}
    except Exception as error:  # noqa: BLE001 - reported by the tests (the nag report, if any)
        templates, failure = {}, str(error)
    report_file = outdir / "validation-report.json"
    if not report_file.is_file():
        return Synthesized(templates, [("synthesis failed", [failure])])
    report = json.loads(report_file.read_text())
    violations = [(v["ruleName"], [w.get("constructPath", "") for w in v["violatingConstructs"]])
                  for plugin in report["pluginReports"] for v in plugin["violations"]
                  if plugin["pluginName"] != "CloudFormation Validate"]
    return Synthesized(templates, violations)
