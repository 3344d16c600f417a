"""A faster JSON-protocol request body, byte for byte what botocore's serializer writes.

botocore builds a JSON request's body by walking the operation's input shape, a Python call per
value, then `json.dumps` of what it built: for a plain input shape (strings, integers,
booleans, lists and maps of them, structures whose members keep their names; no blobs,
timestamps, floats, documents or unions) that walk only copies the parameters, so `json.dumps`
of the parameters is the same body. `PlannedJsonSerializer` (the serializer of a `ClientFactory`
client that skips parameter validation: its callers build requests from values they checked)
skips the walk for such shapes, decided once per shape: 23 → 12 µs for a 10-entry
DeleteMessageBatch. The rest of the request (target header, query-compatible header, host
prefix) and every other shape go through botocore's own code. tests/unit/test_serialize.py
compares both serializers' requests for every plain SQS operation.

botocore has no public way to choose a client's serializer: `use_planned_serializer` replaces
the client's `_serializer` attribute, which botocore's client reads on every call (a test makes a
call through a client and fails if it stops doing so).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from botocore.model import Shape
from botocore.serialize import JSONSerializer

from messenger.fastboto.responses import every_shape

#: Scalar types botocore's JSON serializer copies as they are (not floats and doubles: it
#: writes NaN and the infinities as strings and turns a Decimal into a float).
_PLAIN_SCALARS = frozenset({"string", "integer", "long", "boolean"})

_plain: weakref.WeakKeyDictionary[Shape, bool] = weakref.WeakKeyDictionary()
_plain_lock = threading.Lock()


class PlannedJsonSerializer(JSONSerializer):
    """botocore's JSON serializer; the body of a plain input shape is the parameters as given."""

    def _serialize(self, serialized: Any, value: Any, shape: Any, key: Any = None) -> None:
        if key is None and is_plain(shape):  # the input structure (members are called by key)
            serialized.update(value)
            return
        super()._serialize(serialized, value, shape, key)


def use_planned_serializer(client: Any) -> bool:
    """Give a botocore client the planned serializer when it has botocore's plain (unvalidated)
    JSON serializer; True when it now has it."""
    current: Any = getattr(client, "_serializer", None)
    if type(current) is not JSONSerializer:
        return isinstance(current, PlannedJsonSerializer)
    client._serializer = PlannedJsonSerializer(
        timestamp_precision=current._timestamp_precision)
    return True


def is_plain(shape: Shape) -> bool:
    """Whether botocore's JSON serializer writes a value of `shape` as it is (once per shape)."""
    found = _plain.get(shape)
    if found is None:
        found = every_shape(shape, _plain_node)
        with _plain_lock:
            _plain[shape] = found
    return found


def _plain_node(shape: Shape) -> bool:
    """A shape botocore's JSON serializer copies as it is (its members, if any, aside)."""
    kind = shape.type_name
    if kind == "structure":  # members written under their own names
        return all("name" not in member.serialization for member in shape.members.values())
    return kind in ("list", "map") or kind in _PLAIN_SCALARS
