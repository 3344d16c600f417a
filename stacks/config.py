"""`MessengerConfig`: the typed values `app.py` reads from context and environment."""

from __future__ import annotations

from dataclasses import dataclass

from messenger.channel import validate_namespace
from messenger.ops.settings import MENTION

DEFAULT_SLACK_WEBHOOK_SECRET = "messenger/slack-webhook"


@dataclass(frozen=True)
class MessengerConfig:
    """What the stacks are built from.

    namespace: physical name prefix of every channel resource, e.g. a stage ('' for none).
    account / region: the target environment; None leaves the stacks environment-agnostic.
    slack_webhook_secret: Secrets Manager secret name holding the Slack webhook URL.
    example_channels: deploy the wishlist example channels and consumers (default True).
    alarm_threshold: default queue depth that raises a Slack alert (>= 0).
    cleaner_dry_run: the resource cleaner only reports (default True).
    pipeline: deploy the EMR pipeline stack (default True).
    critical_mention: who a critical queue alarm pings in Slack: '<!here>', '<!channel>',
        '<!subteam^ID>' or '<@USERID>' ('' for nobody, the default).
    """

    namespace: str = ""
    account: str | None = None
    region: str | None = None
    slack_webhook_secret: str = DEFAULT_SLACK_WEBHOOK_SECRET
    example_channels: bool = True
    alarm_threshold: int = 100
    cleaner_dry_run: bool = True
    pipeline: bool = True
    critical_mention: str = ""

    def __post_init__(self) -> None:
        validate_namespace(self.namespace)
        if self.critical_mention and not MENTION.match(self.critical_mention):
            raise ValueError(
                f"critical_mention (context messenger:critical-mention) must be a Slack "
                f"mention: '<!here>', '<!channel>', '<!subteam^ID>' or '<@USERID>', got "
                f"{self.critical_mention!r}"
            )
        if not self.slack_webhook_secret:
            raise ValueError(
                "slack_webhook_secret (context messenger:slack-webhook-secret) is empty"
            )
        if isinstance(self.alarm_threshold, bool) or not isinstance(self.alarm_threshold, int) \
                or self.alarm_threshold < 0:
            raise ValueError(
                f"alarm_threshold (context messenger:alarm-threshold) must be a whole number "
                f">= 0, got {self.alarm_threshold!r}"
            )

    @property
    def stack_prefix(self) -> str:
        """Stack names carry the namespace so several stages live in one account."""
        return f"{self.namespace}-" if self.namespace else ""
