"""A faster parse of SQS's ReceiveMessage (and batch) responses: what botocore's parser gives.

botocore parses a JSON response by walking the operation's output shape member by member, a
Python call per value: ~12 µs per received message, a tenth of a consumer's receive (a plan:
35 instead of 119 µs per 10-message response, measured when this was written). The parser
here (`FastJsonParser`, the JSON parser of every client `ClientFactory` makes) turns the shape of
a response named in FAST_SHAPES into one plan, once, and applies it: a structure keeps its
members (by their JSON names) that are not null, and only the members that need it are
converted (blobs base64-decoded, timestamps parsed, nested structures, lists and maps of them);
the rest is taken as `json.loads` gave it, as botocore's JSON parser takes strings, numbers and
booleans. Errors, headers and response metadata, and every other response, go through
botocore's own code. A shape the plan cannot express (documents, unions, event streams) is left
to botocore as well. tests/unit/test_responses.py holds both parsers' results side by side.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from botocore.model import Shape
from botocore.parsers import JSONParser, ResponseParserFactory

#: Output shapes parsed with a plan: the consumer's and producer's hot paths (a poll, its delete
#: batch, lease renewals, sends).
FAST_SHAPES = frozenset({
    "ReceiveMessageResult", "DeleteMessageBatchResult", "ChangeMessageVisibilityBatchResult",
    "SendMessageBatchResult",
})

#: Turns a JSON value into botocore's value; gets the parser (its blob and timestamp parsers).
Convert = Callable[[Any, JSONParser], Any]

#: The plan of each shape object planned (None: botocore's parser), for as long as the shape
#: lives: each client has its own model, hence its own shapes.
_plans: weakref.WeakKeyDictionary[Shape, Convert | None] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()
_UNPLANNED = object()


class FastJsonParser(JSONParser):
    """botocore's JSON-protocol parser with a planned path for the shapes in FAST_SHAPES."""

    def _handle_json_body(self, raw_body: Any, shape: Any) -> Any:
        plan = plan_for(shape) if shape is not None and shape.name in FAST_SHAPES else None
        if plan is None:
            return super()._handle_json_body(raw_body, shape)
        return plan(self._parse_body_as_json(raw_body), self)


class FastParserFactory(ResponseParserFactory):
    """botocore's parser factory, making `FastJsonParser`s for the JSON protocol."""

    def create_parser(self, protocol_name: str) -> Any:
        if protocol_name == "json":
            return FastJsonParser(**getattr(self, "_defaults", {}))
        return super().create_parser(protocol_name)


def plan_for(shape: Shape) -> Convert | None:
    """The plan for a structure shape; None when botocore's parser must do it. Made once per
    shape object (a client's model keeps its shapes) and dropped with it."""
    plan = _plans.get(shape, _UNPLANNED)
    if plan is not _UNPLANNED:
        return plan  # type: ignore[return-value]
    plan = _convert(shape) if shape.type_name == "structure" and every_shape(shape) else None
    with _plans_lock:
        _plans[shape] = plan
    return plan


def every_shape(
    shape: Shape, accept: Callable[[Shape], bool] | None = None,
    seen: frozenset[int] = frozenset(),
) -> bool:
    """Whether `shape` and every shape in it (members, list items, map keys and values) pass
    `accept`, with none recursive, a document, a tagged union or an event stream: what a plan
    here or in `messenger.fastboto.serialize` can take; the rest is left to botocore."""
    if id(shape) in seen:  # a recursive shape: left to botocore
        return False
    seen = seen | {id(shape)}
    if getattr(shape, "is_document_type", False) or getattr(shape, "is_tagged_union", False) \
            or shape.serialization.get("eventstream") or shape.serialization.get("event"):
        return False
    if accept is not None and not accept(shape):
        return False
    if shape.type_name == "structure":
        return all(every_shape(member, accept, seen) for member in shape.members.values())
    if shape.type_name == "list":
        return every_shape(shape.member, accept, seen)
    if shape.type_name == "map":
        return every_shape(shape.key, accept, seen) and every_shape(shape.value, accept, seen)
    return True


def _convert(shape: Shape) -> Convert | None:
    """How to turn a JSON value of `shape` into botocore's; None: the value as parsed."""
    kind = shape.type_name
    if kind == "blob":
        return lambda value, parser: parser._handle_blob(shape, value)
    if kind == "timestamp":
        return lambda value, parser: parser._handle_timestamp(shape, value)
    if kind == "list":
        item = _convert(shape.member)
        if item is None:
            return None  # botocore copies it; json.loads made it for this response alone
        return lambda value, parser: [None if x is None else item(x, parser) for x in value]
    if kind == "map":
        key, entry = _convert(shape.key), _convert(shape.value)
        if key is None and entry is None:
            return None
        return lambda value, parser: {
            (k if key is None else key(k, parser)):
                (v if entry is None or v is None else entry(v, parser))
            for k, v in value.items()
        }
    if kind == "structure":
        return _structure(shape)
    return None  # strings, numbers, booleans: botocore's JSON parser takes them as they are


def _structure(shape: Shape) -> Convert:
    """A structure keeps its members that are not null, by their JSON names."""
    members = [(name, member.serialization.get("name", name), _convert(member))
               for name, member in shape.members.items()]
    if any(name != json_name for name, json_name, _ in members):
        def renamed(value: Any, parser: JSONParser) -> Any:
            if value is None:
                return None
            parsed = {}
            for name, json_name, convert in members:
                found = value.get(json_name)
                if found is not None:
                    parsed[name] = found if convert is None else convert(found, parser)
            return parsed

        return renamed
    names = frozenset(name for name, _, _ in members)
    special = [(name, convert) for name, _, convert in members if convert is not None]

    def same_names(value: Any, parser: JSONParser) -> Any:
        if value is None:
            return None
        if names.issuperset(value) and None not in value.values():
            parsed = value  # only known, non-null members (as always): json.loads's own dict
        else:
            parsed = {k: v for k, v in value.items() if v is not None and k in names}
        for name, convert in special:
            found = parsed.get(name)
            if found is not None:
                parsed[name] = convert(found, parser)
        return parsed

    return same_names
