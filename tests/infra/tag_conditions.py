"""IAM's evaluation of a statement's `aws:ResourceTag` conditions, for the template tests: whether
a resource carrying `tags` meets them (StringEquals, StringLike, Null: the operators the stacks
use; any other operator or key fails loudly rather than pass). Per the IAM reference, every
operator of a Condition block must hold, and every key within an operator; a key the resource
lacks fails StringEquals/StringLike, and Null tests absence."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

PREFIX = "aws:ResourceTag/"


def tags_meet(condition: Mapping[str, Mapping[str, Any]], tags: Mapping[str, str]) -> bool:
    """True when a resource with `tags` meets every `aws:ResourceTag` test of `condition`."""
    for operator, keys in condition.items():
        for key, expected in keys.items():
            if not key.startswith(PREFIX):
                raise ValueError(f"not a resource tag condition: {operator} {key}")
            value = tags.get(key.removeprefix(PREFIX))
            wanted = expected if isinstance(expected, list) else [expected]
            if operator == "StringEquals":
                ok = value is not None and value in wanted
            elif operator == "StringLike":
                ok = value is not None and any(
                    fnmatch.fnmatchcase(value, pattern.replace("[", "[[]")) for pattern in wanted)
            elif operator == "Null":
                ok = (value is None) == (str(wanted[0]).lower() == "true")
            else:
                raise ValueError(f"operator {operator} not evaluated here")
            if not ok:
                return False
    return True
