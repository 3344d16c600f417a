"""The local endpoint's scheduler: fires the due one-time schedules moto stores but never runs.

moto keeps EventBridge Scheduler schedules (create, get, list, delete) and never fires them. The
embedded endpoint (`messenger local`) runs a `ScheduleFirer` beside the server: about once a
second it lists the schedules of every group, and for each `at(...)` schedule that is due it
calls the schedule's universal target (`arn:aws:scheduler:::aws-sdk:<service>:<action>`, e.g.
`aws-sdk:sqs:sendMessage`) with the target's input as the request, exactly as Scheduler does:

- the context attributes `<aws.scheduler.scheduled-time>`, `<aws.scheduler.schedule-arn>`,
  `<aws.scheduler.execution-id>` and `<aws.scheduler.attempt-number>` are filled in;
- a failed call is retried with backoff (1 s, 2 s, 4 s, ... capped at a minute) up to the
  target's RetryPolicy (attempts, event age), then the input goes to its DeadLetterConfig queue
  with the error in the message attributes Scheduler uses (ERROR_CODE, ERROR_MESSAGE, ...);
- after success, `ActionAfterCompletion=DELETE` deletes the schedule; others are not fired again;
- each due schedule is read again (GetSchedule) right before it is fired: one deleted since the
  pass listed the schedules (a cancel) is not fired.

Unlike Scheduler it fires at the second given (AWS: within the minute), ignores
FlexibleTimeWindow, the role (moto checks no permissions) and templated targets, and does not
run cron or rate schedules (those are deployed by the CDK app and fire on AWS only).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from messenger.jobs.schedules import parse_at

logger = logging.getLogger("messenger.scheduler_fire")

_UNIVERSAL = re.compile(r"^arn:aws:scheduler:::aws-sdk:([a-z0-9-]+):([A-Za-z0-9]+)$")
#: Seconds between passes over the stored schedules.
DEFAULT_INTERVAL = 1.0
MAX_BACKOFF_SECONDS = 60.0


def _snake(action: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower()


def context_input(raw: str, schedule_arn: str, scheduled: datetime, attempt: int) -> str:
    """The target input with Scheduler's context attributes filled in."""
    values = {
        "<aws.scheduler.schedule-arn>": schedule_arn,
        "<aws.scheduler.scheduled-time>": scheduled.astimezone(timezone.utc)
        .strftime("%Y-%m-%dT%H:%M:%SZ"),
        "<aws.scheduler.execution-id>": str(uuid.uuid4()),
        "<aws.scheduler.attempt-number>": str(attempt),
    }
    for placeholder, value in values.items():
        raw = raw.replace(placeholder, value)
    return raw


def invoke_target(session: Any, target: dict[str, Any], schedule_arn: str,
                  scheduled: datetime, attempt: int = 1) -> dict[str, Any]:
    """Call a universal target once, as Scheduler does; returns the API's answer. ValueError for
    a target the local scheduler cannot call (a templated one)."""
    match = _UNIVERSAL.match(target.get("Arn", ""))
    if match is None:
        raise ValueError(f"target {target.get('Arn')!r} is not a universal target "
                         f"(arn:aws:scheduler:::aws-sdk:<service>:<action>)")
    service, action = match.groups()
    request = json.loads(context_input(target.get("Input") or "{}", schedule_arn, scheduled,
                                       attempt))
    client = session(service)
    return dict(getattr(client, _snake(action))(**request))


@dataclass
class _Pending:
    """A due schedule being fired: its attempts so far and when to try again."""

    attempts: int = 0
    next_try: float = 0.0
    first_try: float = field(default_factory=time.time)


class ScheduleFirer:
    """Fires due one-time schedules of the endpoint behind `client_for(service)` (a function
    returning a boto3 client). clock: epoch seconds now (tests move it)."""

    def __init__(self, client_for: Any, interval: float = DEFAULT_INTERVAL,
                 clock: Any = time.time) -> None:
        self.client_for = client_for
        self.interval = interval
        self.clock = clock
        #: (group, name) -> (last modification, schedule) of the schedules seen.
        self._known: dict[tuple[str, str], tuple[Any, dict[str, Any]]] = {}
        self._pending: dict[tuple[str, str], _Pending] = {}
        #: Fired schedules kept after completion (ActionAfterCompletion NONE): never again.
        self._done: set[tuple[str, str, Any]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = 0

    # -- one pass ---------------------------------------------------------------------------
    def _schedules(self) -> list[dict[str, Any]]:
        scheduler = self.client_for("scheduler")
        found = []
        seen = set()
        for group_page in scheduler.get_paginator("list_schedule_groups").paginate():
            for group in group_page.get("ScheduleGroups", []):
                pages = scheduler.get_paginator("list_schedules").paginate(
                    GroupName=group["Name"])
                for page in pages:
                    for summary in page.get("Schedules", []):
                        key = (summary["GroupName"], summary["Name"])
                        seen.add(key)
                        stamp = summary.get("LastModificationDate")
                        known = self._known.get(key)
                        if known is None or known[0] != stamp:
                            try:
                                schedule = scheduler.get_schedule(Name=key[1], GroupName=key[0])
                            except ClientError:
                                continue  # deleted since it was listed
                            known = self._known[key] = (stamp, schedule)
                        found.append(known[1])
        for key in set(self._known) - seen:  # deleted: cancelled or fired
            self._known.pop(key, None)
            self._pending.pop(key, None)
        return found

    def run_once(self) -> int:
        """Fire what is due now; returns how many schedules completed in this pass."""
        now = self.clock()
        completed = 0
        for schedule in self._schedules():
            if schedule.get("State", "ENABLED") != "ENABLED":
                continue
            due = parse_at(schedule.get("ScheduleExpression", ""),
                           schedule.get("ScheduleExpressionTimezone") or "UTC")
            key = (schedule.get("GroupName", "default"), schedule["Name"])
            if due is None or due.timestamp() > now \
                    or (*key, schedule.get("LastModificationDate")) in self._done:
                continue
            pending = self._pending.setdefault(key, _Pending(first_try=now))
            if pending.next_try > now:
                continue
            if self._fire(schedule, due, pending, now):
                completed += 1
        return completed

    def _fire(self, schedule: dict[str, Any], due: datetime, pending: _Pending,
              now: float) -> bool:
        key = (schedule.get("GroupName", "default"), schedule["Name"])
        if not self._still_there(key):  # deleted (cancelled) since this pass listed it
            return False
        target = schedule["Target"]
        pending.attempts += 1
        try:
            invoke_target(self.client_for, target, schedule["Arn"], due, pending.attempts)
        except (ClientError, BotoCoreError, ValueError, TypeError) as error:
            policy = target.get("RetryPolicy") or {}
            retries = int(policy.get("MaximumRetryAttempts", 185))
            age = float(policy.get("MaximumEventAgeInSeconds", 86_400))
            if pending.attempts <= retries and now - pending.first_try < age \
                    and not isinstance(error, (ValueError, TypeError)):
                pending.next_try = now + min(MAX_BACKOFF_SECONDS, 2.0 ** (pending.attempts - 1))
                logger.info("schedule %s/%s: attempt %d failed (%s); retrying", *key,
                            pending.attempts, error)
                return False
            self._dead_letter(schedule, error, pending.attempts)
        else:
            self.fired += 1
            logger.info("schedule %s/%s fired", *key)
        self._pending.pop(key, None)
        self._complete(schedule)
        return True

    def _still_there(self, key: tuple[str, str]) -> bool:
        """Whether the schedule still exists, asked right before it is fired (a pass lists
        every schedule first: one cancelled since must not fire from that list). False: it is
        forgotten. Scheduler has the same race between a firing and a DeleteSchedule, only
        narrower: a cancel takes the job's claim first (`messenger.jobs.fired`)."""
        try:
            self.client_for("scheduler").get_schedule(Name=key[1], GroupName=key[0])
            return True
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
        self._known.pop(key, None)
        self._pending.pop(key, None)
        return False

    def _complete(self, schedule: dict[str, Any]) -> None:
        key = (schedule.get("GroupName", "default"), schedule["Name"])
        if schedule.get("ActionAfterCompletion") == "DELETE":
            try:
                self.client_for("scheduler").delete_schedule(Name=key[1], GroupName=key[0])
            except ClientError:
                pass  # deleted meanwhile
            self._known.pop(key, None)
        else:
            self._done.add((*key, schedule.get("LastModificationDate")))

    def _dead_letter(self, schedule: dict[str, Any], error: BaseException, attempts: int) -> None:
        target = schedule["Target"]
        dlq = (target.get("DeadLetterConfig") or {}).get("Arn")
        logger.warning("schedule %s gave up after %d attempt(s): %s%s", schedule["Name"],
                       attempts, error, f"; to {dlq}" if dlq else " (no DLQ: dropped)")
        if not dlq:
            return
        code = error.response.get("Error", {}).get("Code", "") \
            if isinstance(error, ClientError) else type(error).__name__
        region, account, name = dlq.split(":")[3:6]
        sqs = self.client_for("sqs")
        try:
            url = sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]
            attributes = {
                "ERROR_CODE": code, "ERROR_MESSAGE": str(error)[:1000],
                "EXHAUSTED_RETRY_CONDITION": "MaximumRetryAttempts",
                "RETRY_ATTEMPTS": str(attempts - 1), "TARGET_ARN": target.get("Arn", ""),
                "SCHEDULE_ARN": schedule["Arn"],
            }
            sqs.send_message(QueueUrl=url, MessageBody=target.get("Input") or "{}",
                             MessageAttributes={k: {"DataType": "String", "StringValue": v}
                                                for k, v in attributes.items() if v})
        except (ClientError, BotoCoreError) as failure:
            logger.warning("schedule DLQ %s refused the event: %s", dlq, failure)

    # -- the loop ---------------------------------------------------------------------------
    def start(self) -> ScheduleFirer:
        self._thread = threading.Thread(target=self._run, name="messenger-scheduler",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except (ClientError, BotoCoreError, OSError) as error:  # the server is stopping
                logger.debug("scheduler pass failed: %s", error)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def local_clients(url: str, region: str = "us-east-1") -> Any:
    """A `client_for(service)` of boto3 clients on the endpoint `url`, with dummy credentials."""
    import boto3

    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                     region_name=region)
    made: dict[str, Any] = {}
    lock = threading.Lock()

    def client_for(service: str) -> Any:
        with lock:
            if service not in made:
                made[service] = session.client(service, endpoint_url=url)
            return made[service]

    return client_for
