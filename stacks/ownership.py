"""Which resources are a namespace's own, for IAM: exact ARNs where the names are known at synth,
else the platform's tags (`aws:ResourceTag`), which no other namespace's resource carries.

Namespaces may contain '-' (`shop` and `shop-eu`), and the default namespace '' has no name
prefix at all, so a name pattern (`shop-*`, `*`) is never a namespace's boundary. Every queue and
topic the platform makes, at deploy time or at run time, carries `messenger:managed=true` and,
outside the default namespace, `messenger:namespace=<namespace>` (`ChannelSpec.tags`,
`exchange_tags`; the stacks tag theirs too). SQS queues and SNS topics support `aws:ResourceTag`
on every queue/topic action (the Service Authorization Reference: resource types `queue`,
`topic`), so:

- namespace `shop`: `aws:ResourceTag/messenger:namespace` equals `shop` (never `shop-eu`);
- the default namespace: `messenger:managed` is `true` and there is no `messenger:namespace` tag
  (another namespace's resources all have one; a foreign resource has no `messenger:managed`).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws

from messenger.channel import TAG_MANAGED, TAG_NAMESPACE, TAG_ROLE


def ownership_condition(namespace: str, role: str | None = None) -> dict[str, dict[str, Any]]:
    """The IAM condition block: the resource is the platform's, in `namespace` (and, given
    `role`, tagged `messenger:role=<role>`: 'queue', 'dlq' or 'topic')."""
    equals = {f"aws:ResourceTag/{TAG_MANAGED}": "true"}
    if role is not None:
        equals[f"aws:ResourceTag/{TAG_ROLE}"] = role
    if namespace:
        return {"StringEquals": {**equals, f"aws:ResourceTag/{TAG_NAMESPACE}": namespace}}
    return {"StringEquals": equals, "Null": {f"aws:ResourceTag/{TAG_NAMESPACE}": "true"}}


def any_name(service: str, region: str = Aws.REGION, account: str = Aws.ACCOUNT_ID) -> str:
    """`arn:<partition>:<service>:<region>:<account>:*`: every queue or topic of the account in
    the region, for statements that carry `ownership_condition` (the tags decide, not names)."""
    return f"arn:{Aws.PARTITION}:{service}:{region}:{account}:*"


def ownership_reason(namespace: str) -> str:
    """The cdk-nag acknowledgement of `any_name` under `ownership_condition`."""
    which = (f"{TAG_NAMESPACE}={namespace}" if namespace
             else f"no {TAG_NAMESPACE} tag (the default namespace)")
    return (f"Queues and topics are made at deploy and at run time, so names cannot list them; "
            f"the statement's aws:ResourceTag condition ({TAG_MANAGED}=true and {which}) "
            f"limits it to this namespace's own, which no other namespace's resource matches.")
