"""Typed runtime settings, read once from the environment.

| variable                      | field                    | default                          |
|-------------------------------|--------------------------|----------------------------------|
| MESSENGER_NAMESPACE           | namespace                | '' (no prefix)                   |
| MESSENGER_PROVISIONING        | provisioning             | 'auto' ('auto' or 'verify')      |
| MESSENGER_OFFLOAD_BUCKET      | offload_bucket           | '<ns->messenger-offload-<acct>-<reg>'|
| MESSENGER_OFFLOAD_THRESHOLD   | offload_threshold        | by channel: 1 MiB SQS, 256 KiB SNS|
| MESSENGER_KMS_KEY             | kms_key                  | 'alias/<namespace->messenger'    |
| MESSENGER_RETRY_BUDGET        | retry_budget_seconds     | 20                               |
| MESSENGER_ALARM_THRESHOLD     | default_alarm_threshold  | 100                              |
| MESSENGER_BUCKET_TLS_POLICY   | bucket_tls_policy        | true (the local endpoint: false) |
| MESSENGER_WORKER_INTERVAL     | worker_interval          | 30 s (0.5 to 30)                 |
| MESSENGER_TRACING             | tracing                  | 'auto' ('auto', 'on' or 'off')   |
| MESSENGER_SCHEDULER_ROLE_ARN  | scheduler_role_arn       | '' (the namespace's role)        |
| AWS_REGION / AWS_DEFAULT_REGION | region                 | 'us-east-1'                      |

`AWS_ENDPOINT_URL` is honoured by boto3 itself: messenger never passes an endpoint explicitly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from messenger.channel import (
    SQS_MAX_MESSAGE_BYTES,
    offload_bucket_name,
    platform_key_alias,
    validate_namespace,
)
from messenger.errors import InvalidChannelSpec, InvalidSettings

PROVISIONING_MODES = ("auto", "verify")
#: None: each channel's cheapest (`messenger.offload.DEFAULT_THRESHOLDS`).
DEFAULT_OFFLOAD_THRESHOLD: int | None = None
DEFAULT_RETRY_BUDGET_SECONDS = 20.0
DEFAULT_ALARM_THRESHOLD = 100
#: Seconds between a consumer's refreshes of its worker-registry entry (at most 30).
DEFAULT_WORKER_INTERVAL = 30.0
MIN_WORKER_INTERVAL = 0.5
#: When messages carry trace context (`messenger.tracing`).
TRACING_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class Settings:
    """Runtime settings of producers, consumers and tools.

    namespace: physical name prefix ('' for none). provisioning: 'auto' creates missing
    infrastructure at first use; 'verify' only checks and raises `ChannelNotFound`.
    offload_bucket: S3 bucket for large payloads ('' = derived from namespace and account).
    offload_threshold: encoded size in bytes above which a body goes to S3 (1 to 1 MiB; None:
    the channel kind's cheapest, `messenger.offload.DEFAULT_THRESHOLDS`).
    kms_key: key id, ARN or alias used for queues, topics and the bucket.
    retry_budget_seconds: total time a push may spend retrying transient errors (> 0).
    """

    namespace: str = ""
    provisioning: str = "auto"
    offload_bucket: str = ""
    offload_threshold: int | None = DEFAULT_OFFLOAD_THRESHOLD
    kms_key: str = ""
    retry_budget_seconds: float = DEFAULT_RETRY_BUDGET_SECONDS
    default_alarm_threshold: int = DEFAULT_ALARM_THRESHOLD
    region: str = "us-east-1"
    #: Put a TLS-only bucket policy on an offload bucket it creates. The local endpoint turns
    #: this off: moto ignores policy conditions, so a deny-unless-TLS policy would deny all.
    bucket_tls_policy: bool = True
    #: Seconds between a consumer's refreshes of its worker-registry entry (0.5 to 30).
    worker_interval: float = DEFAULT_WORKER_INTERVAL
    #: Trace context on messages (`messenger.tracing`): 'auto' when the process set an
    #: OpenTelemetry tracer provider, 'on' or 'off'.
    tracing: str = "auto"
    #: The role EventBridge Scheduler assumes to send one-time jobs ('' = the namespace's,
    #: `scheduler_role_name`); the HTTP API's function gets one that reaches its channels only.
    scheduler_role_arn: str = ""

    def __post_init__(self) -> None:
        try:
            validate_namespace(self.namespace)
        except InvalidChannelSpec as error:
            raise InvalidSettings(f"MESSENGER_NAMESPACE: {error}") from None
        if self.provisioning not in PROVISIONING_MODES:
            raise InvalidSettings(
                f"provisioning (MESSENGER_PROVISIONING) must be one of "
                f"{', '.join(PROVISIONING_MODES)}, got {self.provisioning!r}"
            )
        if self.offload_threshold is not None and \
                not 1 <= self.offload_threshold <= SQS_MAX_MESSAGE_BYTES:
            raise InvalidSettings(
                f"offload_threshold (MESSENGER_OFFLOAD_THRESHOLD) must be from 1 to "
                f"{SQS_MAX_MESSAGE_BYTES} bytes, got {self.offload_threshold}"
            )
        budget = self.retry_budget_seconds
        # NaN compares false with everything and inf never runs out: both would retry forever.
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) \
                or not math.isfinite(budget) or budget <= 0:
            raise InvalidSettings(
                f"retry_budget_seconds (MESSENGER_RETRY_BUDGET) must be a finite number of "
                f"seconds > 0, got {budget!r}"
            )
        if isinstance(self.worker_interval, bool) or not isinstance(
                self.worker_interval, (int, float)) \
                or not MIN_WORKER_INTERVAL <= self.worker_interval <= DEFAULT_WORKER_INTERVAL:
            raise InvalidSettings(
                f"worker_interval (MESSENGER_WORKER_INTERVAL) must be from "
                f"{MIN_WORKER_INTERVAL:g} to {DEFAULT_WORKER_INTERVAL:g} seconds, got "
                f"{self.worker_interval!r}"
            )
        if self.tracing not in TRACING_MODES:
            raise InvalidSettings(f"tracing (MESSENGER_TRACING) must be one of "
                                  f"{', '.join(TRACING_MODES)}, got {self.tracing!r}")
        if self.default_alarm_threshold < 0:
            raise InvalidSettings(
                "default_alarm_threshold (MESSENGER_ALARM_THRESHOLD) must be >= 0"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from environment variables (see the module table), then `overrides`."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            "namespace": env.get("MESSENGER_NAMESPACE", ""),
            "provisioning": env.get("MESSENGER_PROVISIONING", "auto"),
            "offload_bucket": env.get("MESSENGER_OFFLOAD_BUCKET", ""),
            "offload_threshold": _number(
                env, "MESSENGER_OFFLOAD_THRESHOLD", DEFAULT_OFFLOAD_THRESHOLD, int
            ),
            "kms_key": env.get("MESSENGER_KMS_KEY", ""),
            "retry_budget_seconds": _number(
                env, "MESSENGER_RETRY_BUDGET", DEFAULT_RETRY_BUDGET_SECONDS, float
            ),
            "default_alarm_threshold": _number(
                env, "MESSENGER_ALARM_THRESHOLD", DEFAULT_ALARM_THRESHOLD, int
            ),
            "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            "bucket_tls_policy": env.get("MESSENGER_BUCKET_TLS_POLICY", "true").lower() != "false",
            "worker_interval": _number(
                env, "MESSENGER_WORKER_INTERVAL", DEFAULT_WORKER_INTERVAL, float
            ),
            "tracing": env.get("MESSENGER_TRACING", "auto") or "auto",
            "scheduler_role_arn": env.get("MESSENGER_SCHEDULER_ROLE_ARN", ""),
        }
        values.update(overrides)
        return cls(**values)

    def with_changes(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    @property
    def kms_alias(self) -> str:
        """The key to use: the configured one, else 'alias/<namespace->messenger'."""
        if self.kms_key:
            return self.kms_key
        return platform_key_alias(self.namespace)

    def bucket_name(self, account_id: str) -> str:
        """The offload bucket: the configured one, else
        '<ns->messenger-offload-<account>-<region>'."""
        if self.offload_bucket:
            return self.offload_bucket
        return offload_bucket_name(self.namespace, account_id, self.region)

    def as_env(self) -> dict[str, str]:
        """The settings as environment variables (to hand to a subprocess or a Spark executor)."""
        return {
            "MESSENGER_NAMESPACE": self.namespace,
            "MESSENGER_PROVISIONING": self.provisioning,
            "MESSENGER_OFFLOAD_BUCKET": self.offload_bucket,
            "MESSENGER_OFFLOAD_THRESHOLD": "" if self.offload_threshold is None
            else str(self.offload_threshold),
            "MESSENGER_KMS_KEY": self.kms_key,
            "MESSENGER_RETRY_BUDGET": str(self.retry_budget_seconds),
            "MESSENGER_ALARM_THRESHOLD": str(self.default_alarm_threshold),
            "AWS_DEFAULT_REGION": self.region,
            "MESSENGER_BUCKET_TLS_POLICY": "true" if self.bucket_tls_policy else "false",
            "MESSENGER_WORKER_INTERVAL": str(self.worker_interval),
            "MESSENGER_TRACING": self.tracing,
        }


def _number(env: Mapping[str, str], name: str, default: Any, kind: type) -> Any:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise InvalidSettings(f"{name} must be a number, got {raw!r}") from None
