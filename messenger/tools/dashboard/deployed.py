"""The dashboard deployed behind an Application Load Balancer (`stacks/dashboard_service.py`):
its settings, read once from the function's environment, and the app they build.

    MESSENGER_NAMESPACE                      the namespace shown
    MESSENGER_DASHBOARD_ALB_ARN              the load balancer whose signed header is trusted
    MESSENGER_DASHBOARD_CLIENT_ID            the IdP app client the listener signs in with
    MESSENGER_DASHBOARD_OPERATOR_GROUPS      comma-separated groups of operators
    MESSENGER_DASHBOARD_GROUPS_CLAIM         the claim holding a user's groups
    MESSENGER_DASHBOARD_REFRESH              seconds between live updates (default 5)
    AWS_REGION                               the load balancer's region (its key endpoint)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from starlette.types import ASGIApp

from messenger.aws import ClientFactory
from messenger.errors import InvalidSettings
from messenger.settings import Settings
from messenger.tools.dashboard.app import Dashboard, build_app
from messenger.tools.dashboard.auth import ALB_KEY_URL, AlbIdentity


@dataclass(frozen=True)
class DeployedSettings:
    """What the deployed dashboard reads from its environment (see the module doc)."""

    region: str
    alb_arn: str
    client_id: str
    operator_groups: frozenset[str]
    groups_claim: str
    refresh_seconds: float = 5.0
    key_url: str = ALB_KEY_URL

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> DeployedSettings:
        missing = [name for name in ("MESSENGER_DASHBOARD_ALB_ARN",
                                     "MESSENGER_DASHBOARD_CLIENT_ID", "AWS_REGION")
                   if not environ.get(name)]
        if missing:
            raise InvalidSettings(f"the deployed dashboard needs {', '.join(missing)}")
        try:
            refresh = float(environ.get("MESSENGER_DASHBOARD_REFRESH", "5"))
        except ValueError:
            refresh = 0
        if not 1 <= refresh <= 3600:
            raise InvalidSettings("MESSENGER_DASHBOARD_REFRESH must be 1 to 3600 seconds")
        groups = environ.get("MESSENGER_DASHBOARD_OPERATOR_GROUPS", "")
        return cls(
            region=environ["AWS_REGION"],
            alb_arn=environ["MESSENGER_DASHBOARD_ALB_ARN"],
            client_id=environ["MESSENGER_DASHBOARD_CLIENT_ID"],
            operator_groups=frozenset(g.strip() for g in groups.split(",") if g.strip()),
            groups_claim=environ.get("MESSENGER_DASHBOARD_GROUPS_CLAIM") or "cognito:groups",
            refresh_seconds=refresh,
        )

    def identity(self) -> AlbIdentity:
        return AlbIdentity(self.region, self.alb_arn, self.client_id, self.operator_groups,
                           self.groups_claim, self.key_url)


def deployed_app(environ: Mapping[str, str] = os.environ, key_url: str = ALB_KEY_URL) -> ASGIApp:
    """The dashboard app as the load balancer's target serves it: every request verified.
    key_url: where the load balancer's keys are (AWS's endpoint; tests serve their own)."""
    deployed = replace(DeployedSettings.from_env(environ), key_url=key_url)
    settings = Settings.from_env()
    dashboard = Dashboard(settings, ClientFactory(settings.region), port=443,
                          refresh_seconds=deployed.refresh_seconds, identity=deployed.identity())
    return build_app(dashboard)
