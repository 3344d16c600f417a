"""`app.py` turns context and environment into a typed MessengerConfig, or a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest

from app import read_config
from stacks.config import MessengerConfig
from stacks.messenger_app import build_app


def _config(monkeypatch: pytest.MonkeyPatch, **context: object) -> MessengerConfig:
    monkeypatch.delenv("CDK_DEFAULT_ACCOUNT", raising=False)
    monkeypatch.delenv("CDK_DEFAULT_REGION", raising=False)
    return read_config(cdk.App(context={f"messenger:{k}": v for k, v in context.items()}))


def test_defaults_are_environment_agnostic(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(monkeypatch)
    assert config == MessengerConfig()
    assert (config.account, config.region, config.example_channels) == (None, None, True)


def test_context_strings_become_typed_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given values as `-c key=value` passes them: strings
    config = _config(monkeypatch, namespace="prod", **{
        "example-channels": "false", "alarm-threshold": "250", "cleaner-dry-run": "false",
        "account": "111122223333", "region": "eu-central-1",
    })
    assert config == MessengerConfig(
        namespace="prod", example_channels=False, alarm_threshold=250, cleaner_dry_run=False,
        account="111122223333", region="eu-central-1",
    )
    assert config.stack_prefix == "prod-"


def test_the_cli_environment_pins_account_and_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "123456789012")
    monkeypatch.setenv("CDK_DEFAULT_REGION", "eu-west-1")
    config = read_config(cdk.App())
    assert (config.account, config.region) == ("123456789012", "eu-west-1")


def test_a_region_without_account_leaves_the_stacks_environment_agnostic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given what the CLI sets without credentials: a default region, no account
    monkeypatch.delenv("CDK_DEFAULT_ACCOUNT", raising=False)
    monkeypatch.setenv("CDK_DEFAULT_REGION", "us-east-1")
    config = read_config(cdk.App())
    # Then nothing is pinned (not aws://unknown-account/us-east-1)
    assert (config.account, config.region) == (None, None)
    context = json.loads((Path(__file__).resolve().parents[2] / "cdk.json").read_text())
    app = cdk.App(context=context["context"])
    stacks = build_app(app, config)
    assert cdk.Token.is_unresolved(stacks.platform.region)
    assert cdk.Token.is_unresolved(stacks.platform.account)


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"alarm-threshold": "many"}, "messenger:alarm-threshold must be a whole number"),
        ({"alarm-threshold": "-1"}, "must be a whole number >= 0"),
        ({"example-channels": "yes"}, "messenger:example-channels must be true or false"),
        ({"namespace": "bad name"}, "may contain only lowercase letters, digits"),
        ({"slack-webhook-secret": ""}, "slack_webhook_secret"),
        ({"region": "eu-west-1"}, "messenger:account and messenger:region .* both or neither"),
    ],
)
def test_bad_context_names_the_key(
    monkeypatch: pytest.MonkeyPatch, context: dict, message: str
) -> None:
    with pytest.raises(Exception, match=message):
        _config(monkeypatch, **context)
