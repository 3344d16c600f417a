#!/usr/bin/env python3
"""The CDK app: `npx cdk synth` / `npx cdk deploy`. The only place that reads context/environment.

Context (cdk.json or `-c key=value`):
  messenger:namespace             physical name prefix, e.g. a stage ('' for none)
  messenger:slack-webhook-secret  Secrets Manager secret name of the Slack webhook URL
  messenger:example-channels      deploy the wishlist example channels (true/false)
  messenger:alarm-threshold       default queue depth that raises an alert
  messenger:cleaner-dry-run       the resource cleaner only reports (true/false)
  messenger:pipeline              deploy the EMR pipeline stack (true/false)
  messenger:account / :region     pin the target environment, both or neither (else
                                  CDK_DEFAULT_ACCOUNT/REGION)
Environment: CDK_DEFAULT_ACCOUNT / CDK_DEFAULT_REGION (set by the CLI when credentials exist);
only both pin the stacks (the CLI sets a region even without credentials): otherwise they are
environment-agnostic. Synthesis needs no AWS access either way.
"""

from __future__ import annotations

import os
from typing import Any

from aws_cdk import App

from examples.cdk import add_example_channels
from stacks.config import DEFAULT_SLACK_WEBHOOK_SECRET, MessengerConfig
from stacks.messenger_app import build_app


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"context {name} must be true or false, got {value!r}")
    return text == "true"


def read_config(app: App) -> MessengerConfig:
    """The typed configuration from the app's context and the CDK environment variables."""

    def context(name: str, default: Any) -> Any:
        value = app.node.try_get_context(f"messenger:{name}")
        return default if value is None else value

    threshold = context("alarm-threshold", 100)
    try:
        threshold = int(threshold)
    except (TypeError, ValueError):
        raise ValueError(
            f"context messenger:alarm-threshold must be a whole number, got {threshold!r}"
        ) from None
    account, region = str(context("account", "")), str(context("region", ""))
    if bool(account) != bool(region):
        raise ValueError(
            "context messenger:account and messenger:region pin the environment together: "
            f"give both or neither (got account={account!r}, region={region!r})"
        )
    if not account:
        # Half an environment (a region without account, as the CLI gives without
        # credentials) would pin the stacks to aws://unknown-account/<region>.
        account = os.environ.get("CDK_DEFAULT_ACCOUNT", "")
        region = os.environ.get("CDK_DEFAULT_REGION", "")
        if not (account and region):
            account = region = ""
    return MessengerConfig(
        namespace=str(context("namespace", "")),
        account=account or None,
        region=region or None,
        slack_webhook_secret=str(context("slack-webhook-secret", DEFAULT_SLACK_WEBHOOK_SECRET)),
        example_channels=_flag(context("example-channels", True), "messenger:example-channels"),
        alarm_threshold=threshold,
        cleaner_dry_run=_flag(context("cleaner-dry-run", True), "messenger:cleaner-dry-run"),
        pipeline=_flag(context("pipeline", True), "messenger:pipeline"),
        critical_mention=str(context("critical-mention", "")),
    )


def main() -> None:
    app = App()
    build_app(app, read_config(app), channels=add_example_channels)
    app.synth()


if __name__ == "__main__":
    main()
