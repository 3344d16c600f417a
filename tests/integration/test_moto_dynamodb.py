"""The local endpoint's DynamoDB: of concurrent conditional writes to one item, exactly one wins,
as on AWS (messenger.tools.moto_dynamodb), also when the server's request threads interleave."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from messenger.tools.local import LocalEndpoint


@pytest.fixture
def endpoint() -> Iterator[LocalEndpoint]:
    with LocalEndpoint() as started:
        yield started


def test_of_racing_conditional_writes_to_one_item_exactly_one_wins(endpoint, monkeypatch):
    from moto.dynamodb.models.table import Table

    assert endpoint.dynamodb_atomic
    # Given a server whose item reads are slow (a request thread that loses the interpreter
    # between the condition's read and the write: what a busy machine does now and then)
    read = Table.get_item

    def slow_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = read(self, *args, **kwargs)
        time.sleep(0.2)
        return found

    monkeypatch.setattr(Table, "get_item", slow_read)
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint.url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")
    dynamodb.create_table(TableName="claims", BillingMode="PAY_PER_REQUEST",
                          KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
                          AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}])
    # When four writers claim the same key at once, each only if nobody has
    outcomes: list[str] = []
    start = threading.Barrier(4)

    def claim(token: str) -> None:
        start.wait()
        try:
            dynamodb.put_item(TableName="claims", Item={"k": {"S": "job-1"}, "t": {"S": token}},
                              ConditionExpression="attribute_not_exists(k)")
            outcomes.append(token)
        except ClientError as error:
            outcomes.append(error.response["Error"]["Code"])

    writers = [threading.Thread(target=claim, args=(f"w{n}",)) for n in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    # Then one won, the others were refused, and the item is the winner's
    winners = [outcome for outcome in outcomes if outcome.startswith("w")]
    assert len(outcomes) == 4 and len(winners) == 1, outcomes
    assert outcomes.count("ConditionalCheckFailedException") == 3
    item = dynamodb.get_item(TableName="claims", Key={"k": {"S": "job-1"}})["Item"]
    assert item["t"]["S"] == winners[0]
