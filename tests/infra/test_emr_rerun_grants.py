"""The EMR job role may publish re-runnable runs (`publish(run_key=)`): claim and mark rows in the
dedup table, and read and update only the run ledger's items there (keys 'run@...')."""

from __future__ import annotations

import json
from typing import Any

from messenger.jobs.runs import RUN_LEDGER_PREFIX
from tests.infra.conftest import CloudAssembly


def job_role_statements(assembly: CloudAssembly) -> list[dict[str, Any]]:
    return [
        statement
        for policy in assembly.resources("AWS::IAM::Policy", "pipeline").values()
        if "EmrJobRole" in json.dumps(policy["Properties"]["Roles"])
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def actions_of(statement: dict[str, Any]) -> set[str]:
    action = statement["Action"]
    return set(action if isinstance(action, list) else [action])


def test_the_job_role_claims_rows_and_keeps_the_run_ledger(assembly: CloudAssembly) -> None:
    statements = job_role_statements(assembly)
    dedup = [s for s in statements if "DedupTable" in json.dumps(s["Resource"])]
    granted = set().union(*(actions_of(s) for s in dedup))
    # The rows' claims: a conditional PutItem, DeleteItem to give one back, BatchWriteItem marks
    assert {"dynamodb:PutItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem"} <= granted
    # The ledger: GetItem (a partition's record) and UpdateItem (the run's), its keys only
    (ledger,) = [s for s in dedup if "dynamodb:GetItem" in actions_of(s)]
    assert actions_of(ledger) == {"dynamodb:GetItem", "dynamodb:UpdateItem"}
    assert ledger["Condition"] == {"ForAllValues:StringLike": {
        "dynamodb:LeadingKeys": [f"{RUN_LEDGER_PREFIX}*"]}}
    # Nothing on the table beyond these (no Scan, no Query, no table-wide read)
    assert granted <= {"dynamodb:PutItem", "dynamodb:DeleteItem", "dynamodb:BatchWriteItem",
                       "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DescribeTable",
                       "dynamodb:ConditionCheckItem"}
