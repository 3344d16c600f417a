"""Jobs that wait for others: held jobs (`push(depends_on=...)`) and groups (`Producer.group`).

Every waiting thing is one item in the workflows table (its attributes:
`messenger.jobs.workflow_items`), written BEFORE anything it waits on can advance it:

- a held job, `job#<job id>`: its prepared send (SQS queue URL or SNS topic ARN, the encoded
  body or its offload pointer, the attributes, the FIFO fields), `pending` (the dependencies
  not final yet: a string set), `done` (dependency → a summary of its outcome), `late`,
  `policy` (on_dependency_failure: 'cancel' or 'run'), `state` (HELD, RELEASING, RELEASED,
  CANCELLED, EXPIRED);
- a group, `group#<group id>`: the same item for its `then` job (its send, absent for a group
  without one; policy 'run': the callback runs with its members' failures), its members as
  the dependencies, and `sent` (False until the producer pushed every member).

Then the waiter registers on each dependency's final-outcome item (`ResultStore.add_waiter`,
waiter = the item's id); a dependency that is final already is applied at once by the
registering producer. A group's members get ids derived from the group id (`<id>.<n>`, the
callback `<id>.then`), so a crash leaves nothing unnamed.

The barrier, one conditional UpdateItem per finishing dependency (`advance`): DELETE the
dependency from `pending`, SET `done.<dep>` to its outcome, on condition that it is still
pending; the answer (ALL_NEW) says whether it was the last. A ConditionalCheckFailed (a repeat,
a late member, or the retry of a write whose answer was lost) re-reads the item: an outcome
other than the one counted is recorded in `late` (the callback is never sent twice), and a
release or cancel that is due is carried out.

The release is owned by the write that made it due: the barrier write that emptied `pending`
of a sent item (its condition says the dependency was pending before), or the mark of a group
as sent (condition: not sent before) once nothing is pending; exactly one write does, since
neither can undo the other. Each of these writes SETs `due_by` (a token of its writer),
`due_at` and `due_dep` (the dependency counted), so the retry of one whose answer was lost
finds its own token. The owner sends, then writes RELEASED: no state change before the send.
Nothing else moves a due item out of HELD (an operator's cancel and the sweeper's expiry need
something pending). A writer that is not the owner takes the release over only when its owner
must have stopped: the outcome it brings is of `due_dep` (that dependency's consumer died after
the barrier write and its job ran again), or SWEEP_GRACE_SECONDS passed since `due_at`; a
take-over is a conditional HELD → RELEASING (a token of its own: one of two takers sends),
the send, then RELEASED (a live owner's send and a taker's are one run: see below). Each move
out of HELD (a take-over,
a cancel, an expiry) carries a token of its writer: the retry of one whose answer was lost
finds its own move. The message carries
its job id and the job-id mark (`jobs.fired`, window: a queue's longest retention), so the
consumer's job-id claim runs it once even if a crash sends it twice (a sweep re-sends a
release its owner left); its meta header DEPENDENCIES_HEADER carries each dependency's result
or failure (`message.dependencies`, `workflow_items.dependencies_text`).
With on_dependency_failure='cancel', the first failed dependency moves HELD → CANCELLED and
settles the held job CANCELLED naming the failed job, so whatever waits on it advances in turn.

Crash safety, by the sweeper (`sweep`, the 15-minute operations run): items not settled carry
`open_shard` and sit in the sparse index 'open' (`open_shard`, `created_at`); for each older
than SWEEP_GRACE_SECONDS it reads the pending dependencies' outcomes (BatchGetItem) and applies
the final ones, sends a release its owner left (due, or RELEASING, since SWEEP_GRACE_SECONDS),
settles again a cancel left unsettled, settles EXPIRED a held job past its channel's retention
that still waits on something, and fails the members of a group whose
producer stopped before marking it sent and that never reached their queue (no status record):
'never sent: the producer stopped'. No scan, no polling.

A dependency must be on a channel that keeps results (`ChannelSpec.keep_results`): only those
write final outcomes. The producer refuses one whose status records name a channel that does
not (`messenger.produce.waiting`).
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, call_with_budget, error_code
from messenger.channel import (
    SNS_MAX_MESSAGE_BYTES,
    SQS_MAX_MESSAGE_BYTES,
    SQS_MAX_RETENTION_SECONDS,
    status_table_name,
    workflows_table_name,
)
from messenger.errors import RetryBudgetExhausted
from messenger.jobs.fired import JOB_WINDOW_HEADER
from messenger.jobs.results import FINAL_SK, FinalOutcome, Outcome, ResultStore
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.jobs.tables import EXPIRES_AT, ensure_table
from messenger.jobs.workflow_items import (
    GROUP,
    HELD_INLINE_BYTES,
    JOB,
    MAX_DEPENDENCIES,
    MAX_GROUP_MEMBERS,
    ON_DEPENDENCY_FAILURE,
    OPEN_INDEX,
    OPEN_SHARDS,
    SWEEP_GRACE_SECONDS,
    Counted,
    Dependent,
    GroupProgress,
    HeldSend,
    State,
    SweepReport,
    Waiting,
    dependencies_text,
    group_member_id,
    group_then_id,
    open_shard,
)
from messenger.message import DEPENDENCIES_HEADER, META_HEADERS_ATTRIBUTE
from messenger.settings import Settings

logger = logging.getLogger("messenger.workflows")

#: Registrations (`ResultStore.add_waiter`) a producer makes at once for one group.
REGISTER_THREADS = 8


class Workflows:
    """Held jobs and groups (see the module doc); safe to share between threads.

    results: the outcomes' store (default one of its own). budget: seconds each call retries
    transient errors (default the settings' retry budget)."""

    def __init__(self, clients: ClientFactory, settings: Settings,
                 results: ResultStore | None = None, budget: float | None = None) -> None:
        self.clients = clients
        self.settings = settings
        self.table = workflows_table_name(settings.namespace)
        self.budget = settings.retry_budget_seconds if budget is None else budget
        self.results = results or ResultStore(clients, settings, budget=budget)
        #: QUEUED records of released jobs whose producer tracks status.
        self.status = StatusStore(clients, settings)
        self._ready = False

    # -- table -------------------------------------------------------------------------------
    def ensure_table(self) -> None:
        """Create the table with its index (auto) or check it exists (verify), once; and the
        status table, where a hold registers on its dependencies' final items (a first push
        with depends_on may come before any status record made it)."""
        if not self._ready:
            call_with_budget(lambda: ensure_table(
                self.clients, self.settings, self.table, "workflows", "id", index=OPEN_INDEX),
                self.budget, f"checking table {self.table!r}")
            call_with_budget(self.results.ensure_table, self.budget,
                             f"checking table {self.results.table!r}")
            self._ready = True

    def _call(self, what: str, method: str, **request: Any) -> Any:
        dynamodb = self.clients.client("dynamodb")
        return call_with_budget(functools.partial(getattr(dynamodb, method),
                                                  TableName=self.table, **request),
                                self.budget, what, error=RetryBudgetExhausted)

    def _update(self, item_id: str, what: str, expression: str, values: dict[str, Any],
                condition: str | None = None, names: dict[str, str] | None = None
                ) -> Waiting | None:
        """One UpdateItem (ReturnValues ALL_NEW): the item after it, None when `condition`
        failed."""
        # Never creates an item: one gone (expired) is not written again.
        condition = f"attribute_exists(id) AND ({condition})" if condition else \
            "attribute_exists(id)"
        names = dict(names or {})
        if "#state" in expression or "#state" in condition:
            names["#state"] = "state"
        request: dict[str, Any] = {
            "Key": {"id": {"S": item_id}}, "UpdateExpression": expression,
            "ConditionExpression": condition, "ReturnValues": "ALL_NEW"}
        if names:
            request["ExpressionAttributeNames"] = names
        if values:
            request["ExpressionAttributeValues"] = values
        try:
            answer = self._call(what, "update_item", **request)
        except ClientError as error:
            if error_code(error) == "ConditionalCheckFailedException":
                return None
            raise
        return Waiting.of_item(answer["Attributes"])

    def read(self, item_id: str) -> Waiting | None:
        """The item `item_id` ('job#<id>', 'group#<id>'), read consistently; None if none."""
        answer = self._call(f"reading {item_id}", "get_item", Key={"id": {"S": item_id}},
                            ConsistentRead=True)
        return Waiting.of_item(answer["Item"]) if "Item" in answer else None

    # -- holding (producers) -----------------------------------------------------------------
    def hold(self, item_id: str, job_id: str, channel: str, send: HeldSend | None,
             dependencies: Iterable[str], policy: str, retention_seconds: int,
             sent: bool = True) -> bool:
        """Write the waiting item (before anything can advance it), then register on each
        dependency, applying at once those final already. False when an item of this id
        exists already (the job is held, or the group recorded, by an earlier push), True
        when written. sent=False: a group whose members are still to be pushed (`mark_sent`)."""
        self.ensure_table()
        deps = list(dict.fromkeys(dependencies))
        now = time.time()
        token = uuid.uuid4().hex
        item: dict[str, Any] = {
            "id": {"S": item_id}, "job_id": {"S": job_id}, "channel": {"S": channel},
            "state": {"S": State.HELD.value}, "policy": {"S": policy},
            "done": {"M": {}}, "late": {"M": {}},
            "created_at": {"N": repr(now)}, "hold_until": {"N": repr(now + retention_seconds)},
            "retention": {"N": str(retention_seconds)}, "sent": {"BOOL": sent},
            "open_shard": {"S": open_shard(item_id)}, "token": {"S": token},
            EXPIRES_AT: {"N": str(int(now + 2 * retention_seconds))},
        }
        # Every barrier write bills the whole item: a group's members named by their count
        # when their ids are the derived ones (`group_member_id`)
        group = item_id[len(GROUP):] if item_id.startswith(GROUP) else None
        if group is not None and deps == [group_member_id(group, n) for n in range(len(deps))]:
            item["members"] = {"N": str(len(deps))}
        else:
            item["deps"] = {"L": [{"S": dep} for dep in deps]}
        if deps:
            item["pending"] = {"SS": deps}
        if send is not None:
            item["send"] = send.item()
        try:  # the same token on every attempt: a retry after a lost answer finds its own
            self._call(f"holding {item_id}", "put_item", Item=item,
                       ConditionExpression="attribute_not_exists(id) OR #t = :t",
                       ExpressionAttributeNames={"#t": "token"},
                       ExpressionAttributeValues={":t": {"S": token}})
        except ClientError as error:
            if error_code(error) != "ConditionalCheckFailedException":
                raise
            return False

        def register(dep: str) -> None:
            outcome = self.results.add_waiter(dep, item_id, retention_seconds)
            if outcome is not None:  # final already: nothing will call us for it
                self._count(item_id, outcome)

        if len(deps) > 1:  # one UpdateItem each: a group's members a few at a time
            with ThreadPoolExecutor(min(REGISTER_THREADS, len(deps))) as pool:
                list(pool.map(register, deps))
        else:
            for dep in deps:
                register(dep)
        if not deps:  # due as written: this producer's release
            self._act(self.read(item_id), owner=True)
        return True

    def mark_sent(self, group_id: str) -> None:
        """A group's members were all pushed: its callback may be released (by this call,
        when every member is final already)."""
        item_id, token = GROUP + group_id, uuid.uuid4().hex
        after = self._update(item_id, f"marking group {group_id} sent",
                             "SET sent = :t, due_by = :me, due_at = :now REMOVE due_dep",
                             {":t": {"BOOL": True}, ":f": {"BOOL": False}, ":me": {"S": token},
                              ":now": {"N": repr(time.time())}}, condition="sent = :f")
        owner = after is not None
        if after is None:  # marked already: by another, or by this call (a lost answer)
            after = self.read(item_id)
            owner = after is not None and after.due_by == token
        self._act(after, owner=owner)

    # -- advancing (whoever reaches a final outcome) -----------------------------------------
    def advance(self, outcome: FinalOutcome, waiters: Iterable[str]) -> None:
        """Count `outcome` for each waiter (ids from `ResultStore.finish`/`add_waiter`): one
        conditional UpdateItem each, then the release or cancel it makes due. Raises what the
        table raises past the retry budget, once every waiter was tried (the caller retries,
        or the sweeper applies it: counting again is harmless)."""
        failure: Exception | None = None
        for waiter in sorted(set(waiters)):
            if not waiter.startswith((JOB, GROUP)):
                logger.warning("job %s: waiter %r is not a workflow item; ignored",
                               outcome.job_id, waiter)
                continue
            try:
                self._count(waiter, outcome)
            except Exception as error:  # the other waiters still advance
                failure = failure or error
        if failure is not None:
            raise failure

    def cancel(self, job_id: str, by: str) -> bool:
        """Cancel a held job (an operator's): it is never sent, its outcome is CANCELLED
        ('cancelled by <by>') and what waits on it advances. False when it is not held
        (released, its release under way: nothing pending any more, settled already, or never
        held)."""
        reason = f"cancelled by {by}"
        if self._move(JOB + job_id, State.CANCELLED, "cancelling", reason=reason,
                      condition="attribute_exists(pending)") is None:
            return False
        self._settle_closed(JOB + job_id, Outcome.CANCELLED, reason)
        return True

    def settle(self, outcome: FinalOutcome, retention_seconds: int) -> None:
        """Record a final outcome reached outside a consumer (an operator's DLQ delete, a
        cancel, a held job cancelled or expired), then advance what waits on it."""
        waiters = self.results.finish(outcome, retention_seconds)
        if waiters:
            self.advance(outcome, waiters)

    def _count(self, item_id: str, outcome: FinalOutcome) -> None:
        """The barrier write for one dependency (see the module doc)."""
        dep = outcome.job_id
        counted = Counted.of(outcome)
        token = uuid.uuid4().hex
        after = self._update(
            item_id, f"counting job {dep} for {item_id}",
            "DELETE pending :one SET done.#dep = :counted, due_by = :me, due_at = :now, "
            "due_dep = :dep",
            {":one": {"SS": [dep]}, ":dep": {"S": dep}, ":counted": counted.item(),
             ":me": {"S": token}, ":now": {"N": repr(time.time())}},
            condition="contains(pending, :dep)", names={"#dep": dep})
        owner = after is not None  # this write counted it: it made the release due if any
        if after is None:  # counted already: a repeat, a late outcome, or our own lost answer
            after = self.read(item_id)
            if after is None:
                return
            owner = after.due_by == token
            first = after.done.get(dep)
            if not owner and first is not None and first.outcome != counted.outcome and \
                    after.late.get(dep) != counted:
                logger.info("%s: job %s finished %s after it was counted %s: recorded late",
                            item_id, dep, counted.outcome, first.outcome)
                after = self._update(item_id, f"recording job {dep} late for {item_id}",
                                     "SET late.#dep = :counted", {":counted": counted.item()},
                                     names={"#dep": dep}) or after
        self._act(after, owner=owner and after.due, known={dep: outcome},
                  take_over=after.due_dep == dep)

    def _act(self, item: Waiting | None, owner: bool = False,
             known: dict[str, FinalOutcome] | None = None, now: float | None = None,
             take_over: bool = False) -> None:
        """Carry out what the item's state makes due: a cancel (whoever sees a failed
        dependency of a 'cancel' job), a release (its owner's: `owner`, this call's write made
        it due; another's when `take_over` (its owner stopped) or its owner left it
        SWEEP_GRACE_SECONDS at `now`), or nothing. known: dependencies' outcomes the caller
        holds (not read again for the message)."""
        if item is None or item.state is not State.HELD:
            return
        if item.policy == "cancel":
            failed = next((dep for dep in item.dependencies
                           if dep in item.done and not item.done[dep].ok), None)
            if failed is not None:
                self._cancel(item, failed)
                return
        if not item.due:
            return
        if owner:
            self._release(item, known)
        elif take_over or (time.time() if now is None else now) - (
                item.due_at or item.created_at) >= SWEEP_GRACE_SECONDS:  # its owner stopped
            moved = self._move(item.id, State.RELEASING, "releasing",
                               condition="attribute_not_exists(pending) AND sent = :t",
                               values={":t": {"BOOL": True}})
            if moved is not None:  # else another took it over
                self._release(moved, known)

    def _cancel(self, item: Waiting, failed: str) -> None:
        counted = item.done[failed]
        reason = (f"dependency {failed} {counted.outcome.replace('_', ' ')}"
                  f"{': ' + counted.reason if counted.reason else ''} "
                  f"(on_dependency_failure='cancel')")
        if self._move(item.id, State.CANCELLED, "cancelling", reason=reason) is None:
            return  # released or cancelled by another
        logger.info("%s: cancelled: %s", item.id, reason)
        self._settle_closed(item.id, Outcome.CANCELLED, reason)

    def _settle_closed(self, item_id: str, outcome: Outcome, reason: str) -> None:
        """Settle a cancelled or expired item's job (chains advance), then close the item."""
        item = self.read(item_id)
        if item is None:
            return
        if item.job_id:
            self.settle(FinalOutcome(item.job_id, item.channel, outcome, time.time(),
                                     reason=reason), item.retention_seconds)
        self._update(item_id, f"closing {item_id}", "REMOVE open_shard", {})

    def _move(self, item_id: str, to: State, what: str, reason: str = "",
              condition: str = "", values: dict[str, Any] | None = None) -> Waiting | None:
        """HELD → `to` (and `condition`), written with a token of this call: the item after
        it, or None when another moved it first. A retry after a lost answer fails the
        condition and finds its own token: moved by this call."""
        token = uuid.uuid4().hex
        moved = self._update(
            item_id, f"{what} {item_id}", "SET #state = :to, moved_by = :me, moved_at = :now"
            + (", reason = :why" if reason else ""),
            {":to": {"S": to.value}, ":me": {"S": token}, ":now": {"N": repr(time.time())},
             ":h": {"S": State.HELD.value}, **({":why": {"S": reason}} if reason else {}),
             **(values or {})},
            condition="#state = :h" + (f" AND {condition}" if condition else ""))
        if moved is not None:
            return moved
        after = self.read(item_id)
        if after is not None and after.state is to and after.moved_by == token:
            return after
        return None

    def _release(self, item: Waiting, known: dict[str, FinalOutcome] | None = None) -> None:
        """Send a due item's message and mark it RELEASED: the owner's (HELD), or a taker's
        (RELEASING)."""
        if item.send is not None:
            self._send(item, known or {})
        self._update(item.id, f"marking {item.id} released",
                     "SET #state = :done, released_at = :now REMOVE open_shard",
                     {":done": {"S": State.RELEASED.value}, ":h": {"S": State.HELD.value},
                      ":r": {"S": State.RELEASING.value}, ":now": {"N": repr(time.time())}},
                     condition="#state IN (:h, :r)")
        logger.info("%s: released job %s", item.id, item.job_id)

    def _send(self, item: Waiting, known: dict[str, FinalOutcome]) -> None:
        """Send the held message, its dependencies' outcomes in its meta headers (those not
        `known` read: one BatchGetItem per 100)."""
        send = item.send
        assert send is not None
        outcomes = {**self.results.get_many(
            [dep for dep in item.dependencies if dep not in known]), **known}
        attributes = {name: dict(value) for name, value in send.attributes.items()}
        limit = SNS_MAX_MESSAGE_BYTES if send.kind == "sns" else SQS_MAX_MESSAGE_BYTES
        headers = json.loads(attributes.get(META_HEADERS_ATTRIBUTE, {}).get("StringValue")
                             or "{}")
        # Its window: a queue's longest retention, so a repeat sent by a sweep much later is
        # still told apart by the consumer's job-id claim.
        headers[JOB_WINDOW_HEADER] = str(SQS_MAX_RETENTION_SECONDS)
        used = len(send.body.encode()) + sum(
            len(name) + len(json.dumps(value)) for name, value in attributes.items()) + 1024
        headers[DEPENDENCIES_HEADER] = dependencies_text(
            [(dep, outcomes.get(dep), item.done.get(dep)) for dep in item.dependencies],
            limit - used)
        attributes[META_HEADERS_ATTRIBUTE] = {"DataType": "String",
                                              "StringValue": json.dumps(headers, sort_keys=True)}
        fifo = {name: value for name, value in (("MessageGroupId", send.group_id),
                                                ("MessageDeduplicationId", send.dedup_id))
                if value}
        sent_at = time.time()  # SQS takes it after this: its consumer's RECEIVED comes later
        if send.kind == "sns":
            sns = self.clients.client("sns")
            call_with_budget(lambda: sns.publish(TopicArn=send.target, Message=send.body,
                                                 MessageAttributes=attributes, **fifo),
                             self.budget, f"releasing job {item.job_id}")
        else:
            sqs = self.clients.client("sqs")
            call_with_budget(lambda: sqs.send_message(QueueUrl=send.target,
                                                      MessageBody=send.body,
                                                      MessageAttributes=attributes, **fifo),
                             self.budget, f"releasing job {item.job_id}")
        if send.tracked:  # written now: a Lambda consumer may be frozen after its batch
            self.status.record(StatusRecord(item.job_id, StatusEvent.QUEUED, item.channel,
                                            at=sent_at))
            try:
                self.status.flush()
            except Exception as error:  # a status record is never a reason to fail a release
                logger.warning("job %s: its QUEUED record was not written: %s", item.job_id,
                               error)

    # -- the sweeper -------------------------------------------------------------------------
    def sweep(self, now: float | None = None) -> SweepReport:
        """Finish what crashes left (see the module doc): every open item older than
        SWEEP_GRACE_SECONDS (at `now`, default the clock's), through the 'open' index."""
        self.ensure_table()
        now = time.time() if now is None else now
        report = SweepReport()
        for shard in range(OPEN_SHARDS):
            request: dict[str, Any] = {
                "IndexName": OPEN_INDEX.name,
                "KeyConditionExpression": "open_shard = :s AND created_at <= :cutoff",
                "ExpressionAttributeValues": {":s": {"S": str(shard)},
                                              ":cutoff": {"N": repr(now - SWEEP_GRACE_SECONDS)}},
                "ProjectionExpression": "id"}
            while True:
                page = self._call("listing open workflow items", "query", **request)
                for entry in page.get("Items", []):
                    report.looked += 1
                    try:
                        self._sweep_one(entry["id"]["S"], now, report)
                    except Exception:  # one item never stops the others
                        logger.exception("sweeping %s failed", entry["id"]["S"])
                if "LastEvaluatedKey" not in page:
                    break
                request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return report

    def _sweep_one(self, item_id: str, now: float, report: SweepReport) -> None:
        item = self.read(item_id)
        if item is None or item.settled:
            return
        if item.state in (State.CANCELLED, State.EXPIRED):  # its settle did not finish
            self._settle_closed(item_id, Outcome(item.state.value.lower()), item.reason)
            report.cancelled += item.state is State.CANCELLED
            report.expired += item.state is State.EXPIRED
            return
        if item.state is State.RELEASING:
            if now - item.moved_at >= SWEEP_GRACE_SECONDS:  # else its taker is sending
                self._release(item)
                report.released += 1
            return
        if item.pending:
            found = self.results.get_many(sorted(item.pending))
            for outcome in found.values():
                self._count(item_id, outcome)
                report.applied += 1
            if item.is_group and not item.sent:
                report.never_sent += self._fail_unsent(item, set(item.pending) - set(found))
        if item.is_group and not item.sent:
            self.mark_sent(item_id[len(GROUP):])
        item = self.read(item_id)
        if item is None or item.state is not State.HELD:
            report.released += item is not None and item.state is State.RELEASED
            report.cancelled += item is not None and item.state is State.CANCELLED
            return
        if now >= item.hold_until and item.pending:  # a due one is released, however late
            reason = (f"dependencies {', '.join(sorted(item.pending))} did not finish within "
                      f"the channel's retention ({item.retention_seconds} s)")
            if self._move(item_id, State.EXPIRED, "expiring", reason=reason,
                          condition="attribute_exists(pending)"):
                self._settle_closed(item_id, Outcome.EXPIRED, reason)
                report.expired += 1
            return
        self._act(item, now=now)
        after = self.read(item_id) if item.due else None
        report.released += after is not None and after.state is State.RELEASED
        report.cancelled += after is not None and after.state is State.CANCELLED

    def _fail_unsent(self, item: Waiting, members: set[str]) -> int:
        """A group's producer stopped before marking it sent: settle the members that never
        reached their queue (no status record) CANCELLED, so the group advances (counted for
        the group too: the producer may have stopped before registering on them)."""
        failed = 0
        for member in sorted(members):
            if self.status.timeline(member):
                continue  # it reached its queue: it will finish
            outcome = FinalOutcome(member, item.channel, Outcome.CANCELLED, time.time(),
                                   reason="never sent: the producer stopped")
            waiters = self.results.finish(outcome, item.retention_seconds)
            self.advance(outcome, waiters | {item.id})
            failed += 1
        return failed

    # -- the read side (API, dashboard) ------------------------------------------------------
    def dependencies_of(self, job_id: str) -> Waiting | None:
        """The held job `job_id` (or the group whose callback it is), None if it never waited."""
        held = self.read(JOB + job_id)
        if held is None and job_id.endswith(".then"):
            held = self.read(GROUP + job_id[:-len(".then")])
        return held

    def dependents_of(self, job_id: str) -> list[Dependent]:
        """What waits on `job_id`: held jobs and groups, from its final-outcome item's waiters."""
        dynamodb = self.clients.client("dynamodb")
        answer = call_with_budget(lambda: dynamodb.get_item(
            TableName=status_table_name(self.settings.namespace),
            Key={"message_id": {"S": job_id}, "sk": {"S": FINAL_SK}},
            ProjectionExpression="waiters", ConsistentRead=True),
            self.budget, f"reading what waits on job {job_id}", error=RetryBudgetExhausted)
        found = []
        for waiter in sorted(answer.get("Item", {}).get("waiters", {}).get("SS", [])):
            if waiter.startswith(JOB):
                found.append(Dependent(waiter[len(JOB):]))
            elif waiter.startswith(GROUP):
                group_id = waiter[len(GROUP):]
                found.append(Dependent(group_then_id(group_id), group_id))
        return found

    def group(self, group_id: str) -> GroupProgress | None:
        """A group's progress (None: no such group)."""
        item = self.read(GROUP + group_id)
        if item is None:
            return None
        return GroupProgress(
            group_id=group_id, members=item.dependencies, finished=len(item.done),
            failed=sum(1 for counted in item.done.values() if not counted.ok),
            state=item.state, then_job=item.job_id, sent=item.sent,
            late=tuple(sorted(item.late)), outcomes=dict(item.done))


__all__ = ["GROUP", "HELD_INLINE_BYTES", "JOB", "MAX_DEPENDENCIES", "MAX_GROUP_MEMBERS",
           "ON_DEPENDENCY_FAILURE", "OPEN_INDEX", "OPEN_SHARDS", "SWEEP_GRACE_SECONDS",
           "Counted", "Dependent", "GroupProgress", "HeldSend", "State", "SweepReport",
           "Waiting", "Workflows", "dependencies_text", "group_member_id", "group_then_id"]
