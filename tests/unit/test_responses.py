"""The planned ReceiveMessage parse gives what botocore's own JSON parser gives."""

from __future__ import annotations

import base64
import copy
import datetime
import json
from typing import Any

import botocore.session
import pytest
from botocore.model import ServiceModel
from botocore.parsers import JSONParser

from messenger.fastboto.responses import FAST_SHAPES, FastJsonParser, FastParserFactory, plan_for

HEADERS = {"x-amzn-requestid": "req-1", "content-type": "application/x-amz-json-1.0"}


def sqs_operation(name: str) -> Any:
    return botocore.session.get_session().get_service_model("sqs").operation_model(name)


def response(body: Any, status: int = 200) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return {"status_code": status, "headers": dict(HEADERS), "body": raw}


def both(operation: Any, answer: dict[str, Any]) -> tuple[Any, Any]:
    ours = FastJsonParser().parse(copy.deepcopy(answer), operation.output_shape)
    theirs = JSONParser().parse(copy.deepcopy(answer), operation.output_shape)
    return ours, theirs


def message(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "MessageId": f"id-{n}", "ReceiptHandle": "r" * 120, "MD5OfBody": "a" * 32,
        "Body": json.dumps({"n": n}), "MD5OfMessageAttributes": "b" * 32,
        "Attributes": {"ApproximateReceiveCount": "2", "SentTimestamp": "1700000000000"},
        "MessageAttributes": {
            "message_id": {"StringValue": f"m-{n}", "DataType": "String"},
            "blob": {"BinaryValue": base64.b64encode(b"\x00\x01bytes").decode(),
                     "DataType": "Binary"},
            "tags": {"StringListValues": ["a", "b"], "BinaryListValues": [
                base64.b64encode(b"x").decode()], "DataType": "String"},
        },
        **extra,
    }


@pytest.mark.parametrize("body", [
    {"Messages": [message(n) for n in range(10)]},
    {"Messages": [message(1, Unknown="dropped", Body=None)]},  # unknown and null members
    {"Messages": [{"MessageId": "x", "ReceiptHandle": "r", "Body": "", "Attributes": {},
                   "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "1"}}}]},
    {"Messages": []},
    {},
    b"",
])
def test_receive_message_parses_like_botocore(body):
    ours, theirs = both(sqs_operation("ReceiveMessage"), response(body))
    assert ours == theirs
    # binary values decoded to bytes, as botocore does
    if body and body.get("Messages") and "blob" in body["Messages"][0]["MessageAttributes"]:
        attributes = ours["Messages"][0]["MessageAttributes"]
        assert attributes["blob"]["BinaryValue"] == b"\x00\x01bytes"
        assert attributes["tags"]["BinaryListValues"] == [b"x"]


def batch_failure(n: int) -> dict[str, Any]:
    return {"Id": str(n), "SenderFault": True, "Code": "ReceiptHandleIsInvalid",
            "Message": f"handle {n} is invalid"}


@pytest.mark.parametrize("operation,body", [
    ("DeleteMessageBatch", {"Successful": [{"Id": str(n)} for n in range(9)],
                            "Failed": [batch_failure(9)]}),
    ("DeleteMessageBatch", {"Successful": [], "Failed": []}),
    ("DeleteMessageBatch", {"Successful": [{"Id": "0", "Extra": 1}], "Failed": None}),
    ("ChangeMessageVisibilityBatch", {"Successful": [{"Id": "0"}], "Failed": [batch_failure(1)]}),
    ("SendMessageBatch", {"Successful": [
        {"Id": "0", "MessageId": "m-0", "MD5OfMessageBody": "a" * 32,
         "MD5OfMessageAttributes": "b" * 32, "SequenceNumber": "1" * 20}],
        "Failed": [batch_failure(1) | {"SenderFault": False}]}),
    ("SendMessageBatch", {}),
])
def test_batch_results_parse_like_botocore(operation, body):
    model = sqs_operation(operation)
    assert model.output_shape.name in FAST_SHAPES
    ours, theirs = both(model, response(body))
    assert ours == theirs


def test_errors_and_other_operations_go_through_botocores_own_parser():
    receive = sqs_operation("ReceiveMessage")
    error = response({"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "gone"}, 400)
    ours, theirs = both(receive, error)
    assert ours == theirs and ours["Error"]["Code"] == "QueueDoesNotExist"
    attributes = sqs_operation("GetQueueAttributes")
    assert attributes.output_shape.name not in FAST_SHAPES
    ours, theirs = both(attributes, response({"Attributes": {"DelaySeconds": "0"}}))
    assert ours == theirs


def test_a_plan_renames_members_parses_timestamps_and_nests_like_botocore():
    # A made-up JSON service, for the paths SQS's shapes do not take
    model = ServiceModel({
        "metadata": {"protocol": "json", "apiVersion": "2020-01-01", "serviceId": "Made Up",
                     "endpointPrefix": "madeup", "jsonVersion": "1.0", "targetPrefix": "M"},
        "operations": {"Get": {"name": "Get", "http": {"method": "POST", "requestUri": "/"},
                               "output": {"shape": "ReceiveMessageResult"}}},
        "shapes": {
            "ReceiveMessageResult": {"type": "structure", "members": {
                "Renamed": {"shape": "S", "locationName": "wire_name"},
                "When": {"shape": "T"},
                "Items": {"shape": "ItemList"},
                "ByKey": {"shape": "ItemMap"},
                "Blobs": {"shape": "BlobList"},
                "Count": {"shape": "I"},
            }},
            "Item": {"type": "structure", "members": {"At": {"shape": "T"},
                                                      "Data": {"shape": "B"}}},
            "ItemList": {"type": "list", "member": {"shape": "Item"}},
            "ItemMap": {"type": "map", "key": {"shape": "S"}, "value": {"shape": "Item"}},
            "BlobList": {"type": "list", "member": {"shape": "B"}},
            "S": {"type": "string"}, "T": {"type": "timestamp"}, "B": {"type": "blob"},
            "I": {"type": "integer"},
        },
    })
    operation = model.operation_model("Get")
    assert plan_for(operation.output_shape) is not None
    blob = base64.b64encode(b"data").decode()
    body = {"wire_name": "renamed", "Renamed": "ignored", "When": 1700000000.5, "Count": 3,
            "Items": [{"At": 1700000001, "Data": blob}, None, {"At": None}],
            "ByKey": {"k": {"Data": blob}, "none": None}, "Blobs": [blob, None]}
    ours, theirs = both(operation, response(body))
    assert ours == theirs
    assert ours["Renamed"] == "renamed" and ours["Items"][0]["Data"] == b"data"
    assert isinstance(ours["When"], datetime.datetime)


def test_clients_of_the_factory_use_the_planned_parser(monkeypatch):
    from messenger.aws import ClientFactory

    factory = FastParserFactory()
    assert isinstance(factory.create_parser("json"), FastJsonParser)
    assert not isinstance(factory.create_parser("query"), FastJsonParser)
    monkeypatch.setenv("MESSENGER_FAST_BOTOCORE", "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    sqs = ClientFactory("us-east-1", endpoint_url="http://127.0.0.1:9").client("sqs")
    assert isinstance(sqs._endpoint._response_parser_factory, FastParserFactory)


def test_a_plan_goes_with_its_clients_model():
    import gc

    from messenger.fastboto import responses

    # Each client has a model of its own: a plan is kept only while its shape lives
    session = botocore.session.get_session()
    shape = session.get_service_model("sqs").operation_model("ReceiveMessage").output_shape
    gc.collect()  # plans of other tests' clients that are garbage already
    before = len(responses._plans)
    assert plan_for(shape) is not None and plan_for(shape) is plan_for(shape)
    assert len(responses._plans) == before + 1
    del shape, session
    gc.collect()
    assert len(responses._plans) == before
