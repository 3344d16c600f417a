"""The planned JSON request body is byte for byte botocore's own."""

from __future__ import annotations

import datetime
from typing import Any

import botocore.session
import pytest
from botocore.awsrequest import AWSResponse
from botocore.model import ServiceModel, Shape
from botocore.serialize import JSONSerializer

from messenger.aws import ClientFactory
from messenger.fastboto.serialize import PlannedJsonSerializer, is_plain

SQS = botocore.session.get_session().get_service_model("sqs")


def sample(shape: Shape, name: str = "v", depth: int = 0) -> Any:
    """A value of every member of `shape` (two of each list and map entry)."""
    kind = shape.type_name
    if kind == "structure":
        return {member: sample(sub, member, depth + 1)
                for member, sub in shape.members.items()} if depth < 6 else {}
    if kind == "list":
        return [sample(shape.member, name, depth + 1) for _ in range(2)]
    if kind == "map":
        return {f"{name}-{n}": sample(shape.value, name, depth + 1) for n in range(2)}
    if kind in ("integer", "long"):
        return 7
    if kind in ("float", "double"):
        return 2.5
    if kind == "boolean":
        return True
    if kind == "blob":
        return b"\x00bytes"
    if kind == "timestamp":
        return datetime.datetime(2026, 11, 23, 18, 0, 0, tzinfo=datetime.UTC)
    return f"{name}-é\"\n"


@pytest.mark.parametrize("operation", SQS.operation_names)
def test_every_sqs_request_is_botocores_own(operation):
    model = SQS.operation_model(operation)
    params = sample(model.input_shape) if model.input_shape is not None else {}
    ours = PlannedJsonSerializer().serialize_to_request(params, model)
    theirs = JSONSerializer().serialize_to_request(params, model)
    assert ours == theirs


def test_the_consumers_requests_are_plain_and_binary_ones_are_not():
    for operation in ("ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch",
                      "ChangeMessageVisibility", "DeleteMessage"):
        assert is_plain(SQS.operation_model(operation).input_shape), operation
    # message attributes may carry binary values: botocore base64-encodes them
    for operation in ("SendMessage", "SendMessageBatch"):
        assert not is_plain(SQS.operation_model(operation).input_shape), operation


def test_renamed_members_timestamps_blobs_and_floats_go_through_botocore():
    model = ServiceModel({
        "metadata": {"protocol": "json", "jsonVersion": "1.0", "targetPrefix": "Made",
                     "apiVersion": "2026-11-23", "serviceId": "Made", "endpointPrefix": "made",
                     "signatureVersion": "v4"},
        "operations": {name: {"name": name, "http": {"method": "POST", "requestUri": "/"},
                              "input": {"shape": name}}
                       for name in ("Renamed", "Timed", "Plain", "Floating")},
        "shapes": {
            "Renamed": {"type": "structure", "members": {
                "Id": {"shape": "Text", "locationName": "id"}}},
            "Timed": {"type": "structure", "members": {
                "At": {"shape": "Time"}, "Data": {"shape": "Bytes"}}},
            "Floating": {"type": "structure", "members": {
                "Ratio": {"shape": "Ratio"}, "Ratios": {"shape": "Ratios"}}},
            "Ratio": {"type": "double"}, "Ratios": {"type": "list", "member": {"shape": "Ratio"}},
            "Plain": {"type": "structure", "members": {
                "Items": {"shape": "Items"}, "Count": {"shape": "Number"}}},
            "Items": {"type": "list", "member": {"shape": "Item"}},
            "Item": {"type": "structure", "members": {"Tags": {"shape": "Tags"}}},
            "Tags": {"type": "map", "key": {"shape": "Text"}, "value": {"shape": "Text"}},
            "Text": {"type": "string"}, "Number": {"type": "integer"},
            "Time": {"type": "timestamp"}, "Bytes": {"type": "blob"},
        },
    })
    plain = {"Renamed": False, "Timed": False, "Plain": True, "Floating": False}
    for operation, expected in plain.items():
        shape = model.operation_model(operation).input_shape
        assert is_plain(shape) is expected, operation
        params = sample(shape)
        if operation == "Floating":  # botocore writes these as strings, json.dumps would not
            params = {"Ratio": float("nan"), "Ratios": [float("inf"), -float("inf"), 0.5]}
        assert PlannedJsonSerializer().serialize_to_request(params, model.operation_model(
            operation)) == JSONSerializer().serialize_to_request(params, model.operation_model(
                operation))


def test_an_unvalidated_client_serializes_through_the_plan(monkeypatch):
    monkeypatch.setenv("MESSENGER_FAST_BOTOCORE", "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    planned: list[str] = []
    original = PlannedJsonSerializer._serialize

    def spy(self: Any, serialized: Any, value: Any, shape: Any, key: Any = None) -> None:
        if key is None and is_plain(shape):
            planned.append(shape.name)
        original(self, serialized, value, shape, key)

    monkeypatch.setattr(PlannedJsonSerializer, "_serialize", spy)
    factory = ClientFactory("us-east-1")
    client = factory.client("sqs", validate_params=False)
    sent: list[bytes] = []

    def answer(params: Any = None, **_: Any) -> Any:  # before-call: no request goes out
        sent.append(params["body"])
        return AWSResponse("https://sqs", 200, {}, None), {"Successful": [], "Failed": []}

    client.meta.events.register("before-call.sqs.DeleteMessageBatch", answer)
    params = {"QueueUrl": "https://sqs.us-east-1.amazonaws.com/1/q",
              "Entries": [{"Id": str(n), "ReceiptHandle": f"handle-{n}"} for n in range(10)]}
    client.delete_message_batch(**params)
    assert planned == ["DeleteMessageBatchRequest"]
    assert sent == [JSONSerializer().serialize_to_request(
        params, SQS.operation_model("DeleteMessageBatch"))["body"]]
    # a validating client keeps botocore's serializer (and its parameter check)
    assert not isinstance(factory.client("sqs")._serializer, PlannedJsonSerializer)
