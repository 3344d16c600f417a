"""DynamoDB's conditional writes atomic on the local endpoint, as they are on AWS.

On AWS a write with a ConditionExpression checks the condition and writes the item as one step:
of two producers claiming one message id with `attribute_not_exists(...)`, exactly one wins
(messenger.jobs.dedup, messenger.jobs.fired rely on it). Stock moto 5.2.5 serves requests on
threads and its backend reads the item, evaluates the condition, then stores the new item with
no lock: two requests can both pass the check and both "win". That shows on a busy machine,
where a request thread loses the interpreter between check and write more often (a dedup race
test sent one id twice at load ~20). `apply()` runs moto's DynamoDB item writes (PutItem,
UpdateItem, DeleteItem, the batch and transaction writes that go through them, PartiQL) one at
a time in this process; reads are unchanged (an item is replaced whole).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from messenger.tools.moto_sqs import MOTO_VERSION  # the release both are written against

#: The backend's methods that write items (batch writes call put_item/delete_item per item).
WRITES = ("put_item", "update_item", "delete_item", "transact_write_items",
          "execute_statement", "execute_transaction", "batch_execute_statement")

log = logging.getLogger(__name__)
_applied = False
#: One lock for every table: item writes are short, and a transaction spans tables.
_writes = threading.RLock()


def _one_at_a_time(write: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(write)
    def serialized(*args: Any, **kwargs: Any) -> Any:
        with _writes:
            return write(*args, **kwargs)

    return serialized


def apply() -> bool:
    """Patch moto's DynamoDB backend in this process; False (and a log line) on another moto."""
    global _applied
    import moto
    from moto.dynamodb.models import DynamoDBBackend

    if _applied:
        return True
    if moto.__version__ != MOTO_VERSION:
        log.warning("moto %s is not %s: DynamoDB's conditional writes keep stock moto's "
                    "races", moto.__version__, MOTO_VERSION)
        return False
    for name in WRITES:
        setattr(DynamoDBBackend, name, _one_at_a_time(getattr(DynamoDBBackend, name)))
    _applied = True
    return True
