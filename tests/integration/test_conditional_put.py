"""Write on a condition, read the old item on failure (`messenger.jobs.tables.put_unless_held`,
behind the claims of jobs.dedup, jobs.fired and jobs.runs) on the local endpoint's DynamoDB."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from messenger.jobs.tables import ensure_table, put_unless_held
from tests.faults import Throttle, injected

CONDITION = "attribute_not_exists(k) OR #owner = :me"


def claim(table: str, owner: str, note: str = "") -> dict:
    return {"TableName": table, "Item": {"k": {"S": "job-1"}, "owner": {"S": owner},
                                         **({"note": {"S": note}} if note else {})},
            "ConditionExpression": CONDITION, "ExpressionAttributeNames": {"#owner": "owner"},
            "ExpressionAttributeValues": {":me": {"S": owner}}}


@pytest.fixture
def table(settings, clients) -> str:
    name = f"{settings.namespace}-claims"
    ensure_table(clients, settings, name, "claims", "k")
    return name


@pytest.fixture
def dynamodb(clients):
    return clients.client("dynamodb")


def test_written_is_none_and_a_held_item_is_returned_as_it_stands(dynamodb, table):
    # Given an item written by ada (None: written)
    assert put_unless_held(dynamodb, claim(table, "ada", "first"), 5.0, "claiming job-1") is None
    # When bob writes on the condition: the item ada wrote is returned, unchanged
    held = put_unless_held(dynamodb, claim(table, "bob"), 5.0, "claiming job-1")
    assert held == {"k": {"S": "job-1"}, "owner": {"S": "ada"}, "note": {"S": "first"}}
    stored = dynamodb.get_item(TableName=table, Key={"k": {"S": "job-1"}}, ConsistentRead=True)
    assert stored["Item"]["owner"] == {"S": "ada"}
    # And ada's own write again passes its condition (a retry after a lost answer)
    assert put_unless_held(dynamodb, claim(table, "ada", "again"), 5.0, "claiming job-1") is None


def test_a_throttled_write_is_retried_within_the_budget(dynamodb, table, clients):
    # Given DynamoDB throttling the first two PutItems (botocore's own retries see them too)
    throttle = Throttle(1.0, {"PutItem"}, times=2)
    with injected(clients, "before-send.dynamodb.PutItem", throttle):
        assert put_unless_held(dynamodb, claim(table, "ada"), 5.0, "claiming job-1") is None
    assert throttle.injected == 2 and throttle.passed == 1


def test_any_other_error_raises(dynamodb, table):
    # a condition naming a value it does not define: DynamoDB's ValidationException
    bad = {**claim(table, "ada"), "ExpressionAttributeValues": {}}
    with pytest.raises(ClientError, match="ValidationException"):
        put_unless_held(dynamodb, bad, 5.0, "claiming job-1")
