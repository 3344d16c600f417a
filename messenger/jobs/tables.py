"""The job features' DynamoDB tables (status, dedup claims, worker registry): created on demand in
`auto` provisioning with TTL on `expires_at`, checked in `verify` mode (the CDK app owns them)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import TAG_MANAGED
from messenger.errors import ChannelNotFound
from messenger.settings import Settings

#: The TTL attribute of every job table (epoch seconds).
EXPIRES_AT = "expires_at"


@dataclass(frozen=True)
class GlobalIndex:
    """A global secondary index of a job table (partition and sort key, their DynamoDB types:
    'S' or 'N'), projecting every attribute."""

    name: str
    hash_key: str
    range_key: str
    hash_type: str = "S"
    range_type: str = "S"


def ensure_table(
    clients: ClientFactory, settings: Settings, table: str, what: str, hash_key: str,
    range_key: str | None = None, dynamodb: Any = None,
    index: GlobalIndex | None = None,
) -> None:
    """Create `table` (string keys, on demand, KMS, TTL on expires_at) in auto mode, or check it
    exists (verify: ChannelNotFound naming `what`). dynamodb: the client to use (default the
    factory's). index: a global secondary index to create with it (projecting every
    attribute)."""
    dynamodb = dynamodb or clients.client("dynamodb")
    try:
        dynamodb.describe_table(TableName=table)
        return
    except ClientError as error:
        if error_code(error) != "ResourceNotFoundException":
            raise
    if settings.provisioning != "auto":
        raise ChannelNotFound(
            f"{what} table {table!r} does not exist (provisioning=verify: deploy it with the "
            f"CDK app)"
        )
    keys = [(hash_key, "HASH")] + ([(range_key, "RANGE")] if range_key else [])
    types = {name: "S" for name, _ in keys}
    extra: dict[str, Any] = {}
    if index is not None:
        types.update({index.hash_key: index.hash_type, index.range_key: index.range_type})
        extra["GlobalSecondaryIndexes"] = [{
            "IndexName": index.name,
            "KeySchema": [{"AttributeName": index.hash_key, "KeyType": "HASH"},
                          {"AttributeName": index.range_key, "KeyType": "RANGE"}],
            "Projection": {"ProjectionType": "ALL"}}]
    try:
        dynamodb.create_table(
            TableName=table,
            KeySchema=[{"AttributeName": name, "KeyType": kind} for name, kind in keys],
            AttributeDefinitions=[{"AttributeName": name, "AttributeType": kind}
                                  for name, kind in types.items()],
            BillingMode="PAY_PER_REQUEST", **extra,
            SSESpecification={"Enabled": True, "SSEType": "KMS"},
            Tags=[{"Key": TAG_MANAGED, "Value": "true"}],
        )
    except ClientError as error:
        if error_code(error) != "ResourceInUseException":  # created meanwhile
            raise
    dynamodb.get_waiter("table_exists").wait(TableName=table)
    dynamodb.update_time_to_live(
        TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": EXPIRES_AT},
    )


def table_exists(clients: ClientFactory, table: str) -> bool:
    try:
        clients.client("dynamodb").describe_table(TableName=table)
    except ClientError as error:
        if error_code(error) == "ResourceNotFoundException":
            return False
        raise
    return True


def put_unless_held(dynamodb: Any, request: dict[str, Any], budget: float, what: str
                    ) -> dict[str, Any] | None:
    """Write on a condition, read the old item on failure: one PutItem `request` (TableName,
    Item, ConditionExpression, ...), retried within `budget` seconds (`call_with_budget`,
    `what` naming it), asking DynamoDB for the item that fails the condition. None when it was
    written; else that item ({} when DynamoDB returned none: it was deleted meanwhile). Any
    other error raises. The claims of `jobs.dedup`, `jobs.fired` and `jobs.runs` take their
    ids with it.

    The same request is sent on every attempt: a retry after an answer that was lost (the
    write landed) finds the item it wrote, so the condition should accept the writer's own
    item (its token, its SQS message id)."""
    try:
        call_with_budget(functools.partial(
            dynamodb.put_item, **request, ReturnValuesOnConditionCheckFailure="ALL_OLD"),
            budget, what)
        return None
    except ClientError as error:
        if error_code(error) != "ConditionalCheckFailedException":
            raise
        return dict(error.response.get("Item") or {})
