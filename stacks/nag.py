"""cdk-nag (v3) helpers: every acknowledgement names its rule (or finding) and a real reason."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge `rule` (e.g. 'AwsSolutions-S1' or 'AwsSolutions-IAM5[Resource::*]') on `scope`
    and everything under it, with the reason a reviewer needs."""
    if len(reason.split()) < 6:
        raise ValueError(f"acknowledgement of {rule} needs a real reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def acknowledge_wildcard_resource(scope: IConstruct, resource: str, reason: str) -> None:
    """Acknowledge the IAM5 finding of one wildcard resource ARN (a string or a token)."""
    acknowledge(scope, f"AwsSolutions-IAM5[Resource::{nag_reference(scope, resource)}]", reason)


def nag_reference(scope: IConstruct, value: str) -> str:
    """How cdk-nag prints `value` in a finding id (its flattenCfnReference): `<Ref>`,
    `<Logical.Attr>`, joins concatenated. Only for values of `scope`'s own stack."""
    return _flatten(Stack.of(scope).resolve(value))


def _flatten(node: Any) -> str:
    if node is None:
        return ""
    if isinstance(node, str):
        return node.replace("${", "<").replace("}", ">")
    if isinstance(node, dict):
        if "Fn::Join" in node:
            delimiter, items = node["Fn::Join"]
            return delimiter.join(_flatten(item) for item in items)
        if "Fn::GetAtt" in node:
            resource, attribute = node["Fn::GetAtt"]
            return f"<{_flatten(resource)}.{_flatten(attribute)}>"
        if "Ref" in node:
            return f"<{_flatten(node['Ref'])}>"
        if "Fn::ImportValue" in node:  # a cross-stack reference: cdk-nag prints the export
            return _flatten(node["Fn::ImportValue"])
    return json.dumps(node)
