"""Typed settings of the ops Lambdas, read once from the environment.

| variable                  | field                   | default                               |
|---------------------------|-------------------------|---------------------------------------|
| SLACK_WEBHOOK_SECRET      | slack_webhook_secret    | required: the secret's *name*         |
| MESSENGER_NAMESPACE       | namespace               | '' (resources without namespace tag)  |
| MESSENGER_ALARM_THRESHOLD | default_alarm_threshold | 100                                   |
| CLEANER_DRY_RUN           | dry_run                 | 'false' ('true' or 'false')           |
| MESSENGER_CRITICAL_MENTION| critical_mention        | '' (e.g. '<!here>', '<!subteam^S0X1>')|
| AWS_REGION                | region                  | 'us-east-1'                           |
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from messenger.errors import InvalidSettings
from messenger.settings import Settings

BOOLEAN_VALUES = ("true", "false")
#: Slack mention syntax a critical alarm may ping: a channel's members, a user group, a user.
MENTION = re.compile(r"^<!(here|channel)>$|^<!subteam\^[A-Z0-9]+>$|^<@[A-Z0-9]+>$")


@dataclass(frozen=True)
class OpsSettings:
    """What the queue alarm and the resource cleaner need to know.

    slack_webhook_secret: name of the secret whose value is the webhook URL (or JSON {"url": ...}).
    namespace: the stage whose resources are checked. default_alarm_threshold: queue depth above
    which a queue without an alarm-threshold tag is reported (>= 0). dlq_alarm_threshold: the
    same for dead-letter queues without a dlq-alarm-threshold tag (default 0: any dead letter,
    MESSENGER_DLQ_ALARM_THRESHOLD). dry_run: the cleaner reports
    what it would delete and deletes nothing. critical_mention: who the critical variant of the
    alarm pings, in Slack's syntax ('<!here>', '<!channel>', '<!subteam^ID>', '<@USERID>'; '':
    nobody).
    """

    slack_webhook_secret: str
    namespace: str = ""
    default_alarm_threshold: int = 100
    dlq_alarm_threshold: int = 0
    dry_run: bool = False
    region: str = "us-east-1"
    critical_mention: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OpsSettings:
        env = os.environ if environ is None else environ
        secret = env.get("SLACK_WEBHOOK_SECRET", "")
        if not secret:
            raise InvalidSettings(
                "SLACK_WEBHOOK_SECRET must name the Secrets Manager secret that holds the "
                "Slack webhook URL"
            )
        dry_run = env.get("CLEANER_DRY_RUN", "false").strip().lower()
        if dry_run not in BOOLEAN_VALUES:
            raise InvalidSettings(
                f"CLEANER_DRY_RUN must be one of {', '.join(BOOLEAN_VALUES)}, got {dry_run!r}"
            )
        core = Settings.from_env(env)
        raw_dlq = env.get("MESSENGER_DLQ_ALARM_THRESHOLD", "0").strip()
        if not raw_dlq.isdigit():
            raise InvalidSettings(
                f"MESSENGER_DLQ_ALARM_THRESHOLD must be a whole number >= 0 (0: any dead letter "
                f"alarms), got {raw_dlq!r}"
            )
        mention = env.get("MESSENGER_CRITICAL_MENTION", "").strip()
        if mention and not MENTION.match(mention):
            raise InvalidSettings(
                f"MESSENGER_CRITICAL_MENTION must be a Slack mention: '<!here>', '<!channel>', "
                f"'<!subteam^ID>' (a user group) or '<@USERID>', got {mention!r}"
            )
        return cls(
            critical_mention=mention,
            slack_webhook_secret=secret,
            namespace=core.namespace,
            default_alarm_threshold=core.default_alarm_threshold,
            dlq_alarm_threshold=int(raw_dlq),
            dry_run=dry_run == "true",
            region=core.region,
        )
