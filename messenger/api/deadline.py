"""One deadline per API request, shared by every AWS call the request makes.

API Gateway ends an integration after 29 s and Lambda a function at its timeout; an answer that
comes later is a gateway 5xx whatever the function decided. So a request gets one deadline,
`answer_by` (the function's remaining time, at most API Gateway's 29 s, less a margin for the
answer's way back), and `DeadlineGuard`, botocore hooks on the API's clients (public events
only), holds every call of the request to it:

- no attempt of any call starts after `answer_by` (`DeadlinePassed`, a BotoCoreError: callers
  that log a failed record after the send treat it as any other failure);
- a send (SQS SendMessage/SendMessageBatch, SNS Publish/PublishBatch, Scheduler CreateSchedule)
  starts only while `SEND_RESERVE_SECONDS` are left, so its answer is normally back before the
  deadline;
- the sends SQS (SNS, Scheduler) accepted are recorded with their job ids as their answers come
  back: once the deadline passes, `JobApi` answers from that record (202 for the jobs accepted,
  503 + Retry-After for the others), whatever the request's remaining calls are still doing.

The request runs in a worker thread; the guard's state is per thread (botocore runs a call's
events in the calling thread), so the hooks of one request never see another's.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError

from messenger.aws import ClientFactory
from messenger.message import MESSAGE_ID_ATTRIBUTE

#: A send starts only while this much of the request's time is left: SQS answers in tens of
#: milliseconds; a send that would start later is refused (nothing sent: a 503 the client may
#: retry) rather than left to answer after the deadline (the job's fate unknown).
SEND_RESERVE_SECONDS = 8.0
#: Operations whose success means the job was accepted.
SEND_OPERATIONS = frozenset({"sqs.SendMessage", "sqs.SendMessageBatch", "sns.Publish",
                             "sns.PublishBatch", "scheduler.CreateSchedule"})


class DeadlinePassed(BotoCoreError):
    """An AWS call of an API request refused by `DeadlineGuard`: the request's deadline passed
    (or too little of it was left for a send)."""

    fmt = "{operation} not made: {reason}"


@dataclass
class RequestState:
    """What a request's AWS calls did, as far as its deadline is concerned."""

    answer_by: float
    #: The main thread answered (the deadline passed): every later call of the request is refused.
    abandoned: bool = False
    #: Job ids of sends SQS / SNS / Scheduler accepted, and whether each is a schedule.
    accepted: dict[str, bool] = field(default_factory=dict)
    #: Sends whose answer has not come back (their jobs' fate is unknown meanwhile).
    sends_in_flight: int = 0
    #: A send failed after its request went out: its job may have been accepted.
    unconfirmed: bool = False
    #: Calls refused for the deadline (operation names).
    refused: list[str] = field(default_factory=list)
    #: What the route tells a late answer: the job ids it pushes, by batch index, ...
    notes: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def sends_by(self) -> float:
        return self.answer_by - SEND_RESERVE_SECONDS

    def left(self) -> float:
        return self.answer_by - time.monotonic()


class DeadlineGuard:
    """botocore hooks holding the calls of the current thread's request to its deadline."""

    def __init__(self) -> None:
        self._local = threading.local()

    def attach(self, clients: ClientFactory) -> DeadlineGuard:
        clients.register("before-parameter-build", self._remember_params)
        clients.register("before-send", self._before_send)
        clients.register("after-call", self._after_call)
        clients.register("after-call-error", self._after_call_error)
        return self

    # -- the request's thread -------------------------------------------------------------------
    def enter(self, state: RequestState) -> None:
        self._local.state = state

    def leave(self) -> None:
        self._local.state = None

    def current(self) -> RequestState | None:
        return getattr(self._local, "state", None)

    # -- hooks ----------------------------------------------------------------------------------
    def _before_send(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        state = self.current()
        if state is None:
            return
        operation = _operation(event_name)
        now = time.monotonic()
        with state.lock:
            if state.abandoned or now >= state.answer_by:
                reason = "the request's deadline passed"
            elif operation in SEND_OPERATIONS and now > state.sends_by:
                reason = (f"less than {SEND_RESERVE_SECONDS:g} s of the request's deadline "
                          f"left for a send")
            else:
                if operation in SEND_OPERATIONS and not getattr(self._local, "sending", False):
                    state.sends_in_flight += 1  # once per call, not per attempt
                    self._local.sending = True
                return
            state.refused.append(operation)
        raise DeadlinePassed(operation=operation, reason=reason)

    def _after_call(self, http_response: Any = None, parsed: Any = None, model: Any = None,
                    context: Any = None, event_name: str = "", **_: Any) -> None:
        state = self.current()
        if state is None or not getattr(self._local, "sending", False):
            return
        self._local.sending = False
        operation = _operation(event_name)
        params = getattr(self._local, "params", None) or {}
        ok = http_response is not None and getattr(http_response, "status_code", 500) < 300
        with state.lock:
            state.sends_in_flight -= 1
            if not ok and getattr(http_response, "status_code", 500) >= 500:
                state.unconfirmed = True  # a 5xx send may still have been applied
            if ok:
                for job_id in _accepted_ids(operation, params, parsed or {}):
                    state.accepted[job_id] = operation == "scheduler.CreateSchedule"

    def _after_call_error(self, event_name: str = "", **_: Any) -> None:
        state = self.current()
        if state is None or not getattr(self._local, "sending", False):
            return
        self._local.sending = False
        with state.lock:
            state.sends_in_flight -= 1
            state.unconfirmed = True

    def _remember_params(self, params: Any = None, event_name: str = "", **_: Any) -> None:
        """botocore `before-parameter-build` hook: the parameters of the call being made."""
        if self.current() is not None and _operation(event_name) in SEND_OPERATIONS:
            self._local.params = params


def _operation(event_name: str) -> str:
    """'sqs.SendMessage' of 'before-send.sqs.SendMessage'."""
    return ".".join(event_name.split(".")[1:3])


def _message_id(attributes: Any) -> str | None:
    if not isinstance(attributes, Mapping):
        return None
    value = (attributes.get(MESSAGE_ID_ATTRIBUTE) or {}).get("StringValue")
    return str(value) if value else None


def _accepted_ids(operation: str, params: Mapping[str, Any], parsed: Mapping[str, Any]
                  ) -> list[str]:
    """The job ids a successful send accepted (read from its own request)."""
    if operation in ("sqs.SendMessage", "sns.Publish"):
        found = _message_id(params.get("MessageAttributes"))
        return [found] if found else []
    if operation in ("sqs.SendMessageBatch", "sns.PublishBatch"):
        entries = params.get("Entries") or params.get("PublishBatchRequestEntries") or []
        by_entry = {entry.get("Id"): _message_id(entry.get("MessageAttributes"))
                    for entry in entries}
        return [job for ok in parsed.get("Successful") or []
                if (job := by_entry.get(ok.get("Id")))]
    if operation == "scheduler.CreateSchedule":
        try:
            target = json.loads((params.get("Target") or {}).get("Input") or "{}")
        except ValueError:
            return []
        found = _message_id(target.get("MessageAttributes"))
        return [found] if found else []
    return []
