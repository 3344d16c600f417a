"""The platform as a team app composes it synthesizes under CDK's default feature flags, not only
under this repository's `cdk.json`, and under the flags `cdk init` gives a new app: the same
stacks and resources, cdk-nag clean, in each (one in-process synth of each per session)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest

from examples.cdk import add_example_channels
from stacks.config import MessengerConfig
from stacks.messenger_app import build_app
from tests.infra.conftest import ACCOUNT, REGION

REPO = Path(__file__).resolve().parents[2]
#: The feature flags of this repository's cdk.json (its `messenger:` keys are app.py's to read).
CDK_JSON_FLAGS = {key: value
                  for key, value in json.loads((REPO / "cdk.json").read_text())["context"].items()
                  if not key.startswith("messenger:")}
#: What `cdk init` writes into a new app's cdk.json, from the pinned CLI (package.json).
CDK_INIT_FLAGS = REPO / "node_modules" / "aws-cdk" / "lib" / "init-templates" / \
    ".recommended-feature-flags.json"
VARIANTS = ["no feature flags", "cdk.json's feature flags", "cdk init's feature flags"]
NAMESPACE = "flags"


@dataclass
class Synthesized:
    templates: dict[str, dict[str, Any]] | None  # None: synthesis failed
    error: str
    violations: list[tuple[str, str, list[str]]]  # cdk-nag: plugin, rule, constructs


def _synthesize(outdir: Path, context: dict[str, Any]) -> Synthesized:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("CDK_CONTEXT_JSON", raising=False)  # nothing but `context` reaches the app
        app = cdk.App(outdir=str(outdir), context=context,
                      builtin_cloud_formation_validation=False)
        # without feature flags, also without an account or region (`cdk synth` with no
        # credentials, as the demo runs it): ARNs then hold tokens, which a cdk-nag
        # acknowledgement must name as cdk-nag prints them (one naming a plain f-string of a
        # token failed this synth)
        config = (MessengerConfig(namespace=NAMESPACE) if not context else
                  MessengerConfig(namespace=NAMESPACE, account=ACCOUNT, region=REGION))
        try:
            build_app(app, config, channels=add_example_channels)  # as app.py composes it
            assembly = app.synth()
        except Exception as error:  # reported by the tests, one per variant
            return Synthesized(None, str(error), [])
    report = json.loads((outdir / "validation-report.json").read_text())
    violations = [
        (plugin["pluginName"], violation["ruleName"],
         [where.get("constructPath", "") for where in violation["violatingConstructs"]])
        for plugin in report["pluginReports"] for violation in plugin["violations"]
    ]
    return Synthesized({stack.stack_name: stack.template for stack in assembly.stacks}, "",
                       violations)


def _contexts() -> dict[str, dict[str, Any]]:
    if not CDK_INIT_FLAGS.is_file():
        pytest.fail(f"{CDK_INIT_FLAGS} is missing: run `npm install`, or find where the CLI "
                    f"keeps the flags `cdk init` writes now")
    init_flags = json.loads(CDK_INIT_FLAGS.read_text())
    return dict(zip(VARIANTS, [{}, CDK_JSON_FLAGS, init_flags], strict=True))


@pytest.fixture(scope="session")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Synthesized]:
    return {name: _synthesize(tmp_path_factory.mktemp("flags"), context)
            for name, context in _contexts().items()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_platform_synthesizes_cdk_nag_clean(
    variants: dict[str, Synthesized], variant: str
) -> None:
    synthesized = variants[variant]
    assert synthesized.error == ""
    assert synthesized.templates is not None
    assert set(synthesized.templates) == {
        f"{NAMESPACE}-MessengerPlatform", f"{NAMESPACE}-MessengerExamples",
        f"{NAMESPACE}-MessengerPipeline",
    }
    assert synthesized.violations == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_access_logs_are_delivered_by_bucket_policy_not_acl(
    variants: dict[str, Synthesized], variant: str
) -> None:
    # Given every bucket that logs its access, in every stack
    templates = variants[variant].templates
    assert templates is not None
    logging_buckets = 0
    for template in templates.values():
        resources = template["Resources"]
        buckets = {k: r["Properties"] for k, r in resources.items()
                   if r["Type"] == "AWS::S3::Bucket"}
        logged = {k: p["LoggingConfiguration"] for k, p in buckets.items()
                  if "LoggingConfiguration" in p}
        for source, logging in logged.items():
            target = logging["DestinationBucketName"]["Ref"]
            # Then its log bucket keeps ACLs disabled and lets S3's log delivery write by policy
            assert "AccessControl" not in buckets[target]
            assert buckets[target]["OwnershipControls"] == {
                "Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
            (policy,) = [r["Properties"]["PolicyDocument"] for r in resources.values()
                         if r["Type"] == "AWS::S3::BucketPolicy"
                         and r["Properties"]["Bucket"] == {"Ref": target}]
            assert any(statement["Principal"] == {"Service": "logging.s3.amazonaws.com"}
                       and statement["Action"] == "s3:PutObject"
                       and statement["Effect"] == "Allow"
                       for statement in policy["Statement"]), (source, policy)
        logging_buckets += len(logged)
    assert logging_buckets == 2  # the offload bucket and the EMR pipeline's code bucket


#: Resources a variant's flags add to the app without flags: `cdk init`'s
#: @aws-cdk/aws-ec2:restrictDefaultSecurityGroup strips the VPC's default security group's rules
#: through a custom resource (its provider function and role).
ADDED_BY_FLAGS = {
    "cdk.json's feature flags": [],
    "cdk init's feature flags": ["AWS::IAM::Role", "AWS::Lambda::Function",
                                 "Custom::VpcRestrictDefaultSG"],
}


@pytest.mark.parametrize("variant", VARIANTS[1:])
def test_the_flags_change_no_resource_of_ours(
    variants: dict[str, Synthesized], variant: str
) -> None:
    # Every resource synthesized without flags is there with them, of the same type (the flags
    # only write it differently: partition literals, minimized policies), and the flags add only
    # what CDK adds for them
    def resources(synthesized: Synthesized) -> dict[str, str]:
        return {f"{stack}/{k}": r["Type"]
                for stack, template in (synthesized.templates or {}).items()
                for k, r in template["Resources"].items()}

    without, given = resources(variants[VARIANTS[0]]), resources(variants[variant])
    assert without and {k: given.get(k) for k in without} == without
    assert sorted(given[k] for k in given.keys() - without.keys()) == ADDED_BY_FLAGS[variant]
