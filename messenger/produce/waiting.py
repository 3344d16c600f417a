"""Pushes that wait: `push(depends_on=...)` holds a job until its dependencies are final, and
`Producer.group(items, then=...)` pushes members whose callback runs once after all of them.

The producer prepares the held message as it would send it (checked, encoded, its job id
fixed, a large body offloaded), locates its queue or topic, and hands it to
`messenger.jobs.workflows.Workflows`, which keeps it, counts the dependencies' outcomes and
sends it (see that module for the protocol and its crash safety).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from botocore.exceptions import BotoCoreError, ClientError

from messenger.aws import ClientFactory
from messenger.channel import ChannelSpec, declared_keep_results
from messenger.errors import ChannelNotFound, InvalidMessage, MessengerError
from messenger.jobs.results import FinalOutcome, Outcome
from messenger.jobs.status import StatusStore, TrackingDeclarations
from messenger.jobs.workflows import (
    GROUP,
    HELD_INLINE_BYTES,
    JOB,
    MAX_DEPENDENCIES,
    MAX_GROUP_MEMBERS,
    ON_DEPENDENCY_FAILURE,
    HeldSend,
    Workflows,
    group_member_id,
    group_then_id,
)
from messenger.message import EncodedMessage
from messenger.produce.checks import check_id
from messenger.produce.push import PushedId, PushFailure, PushItem, PushManyResult
from messenger.produce.transport import QueueTarget, TopicTarget
from messenger.settings import Settings


@dataclass(frozen=True)
class Group:
    """What `Producer.group` returns: the group id, its members' job ids (in the items' order),
    the callback's job id ('' without one), the members that could not be pushed (each
    settled as cancelled, 'never sent: ...', so the group still advances) and whether the
    group id was recorded already (`duplicate`: nothing was pushed)."""

    group_id: str
    member_ids: tuple[str, ...]
    then_id: str
    failures: tuple[PushFailure, ...] = ()
    duplicate: bool = False
    pushed: PushManyResult | None = field(default=None, compare=False, repr=False)


class WaitingJobs:
    """`BaseProducer`'s part for jobs that wait (see the module doc); it uses the producer's
    preparation, targets and settings."""

    # What BaseProducer provides (declared for type checking).
    channel: ClassVar[str]
    messaging_system: ClassVar[str]
    clients: ClientFactory
    settings: Settings
    _prepare: Any
    _with_target: Any
    _level: Any
    _spec: Any
    _offload: Any
    push_many: Any
    status: StatusStore | None
    _check_keeps_results: Any

    @functools.cached_property
    def workflows(self) -> Workflows:
        """The workflows store held jobs and groups are kept in."""
        return Workflows(self.clients, self.settings)

    @functools.cached_property
    def _keeps_results(self) -> TrackingDeclarations:
        return TrackingDeclarations(self.clients, self.settings, declared=declared_keep_results)

    def group(self, items: Iterable[PushItem | Any], then: PushItem | Any = None, *,
              group_id: str | None = None, then_to: WaitingJobs | None = None) -> Group:
        """Push `items` (PushItems or bodies, 1 to MAX_GROUP_MEMBERS) as one group: `then` (a
        PushItem or a body; None: no callback) is sent exactly once after every member reached
        a final outcome, its `message.dependencies` holding each member's result or failure.
        The channel must keep results (`keep_results`). group_id: the caller's own id (default
        a new one); members' job ids are '<group_id>.<n>', the callback's '<group_id>.then'
        (an item's own message_id is replaced). then_to: the producer that sends the callback
        (default this one). A group id recorded already is a duplicate: nothing is pushed."""
        members = [item if isinstance(item, PushItem) else PushItem(item) for item in items]
        if not 1 <= len(members) <= MAX_GROUP_MEMBERS:
            raise InvalidMessage(f"items: a group has 1 to {MAX_GROUP_MEMBERS} members, got "
                                 f"{len(members)}")
        group_id = uuid.uuid4().hex if group_id is None else group_id
        check_id("group_id", group_id)
        self._check_keeps_results()
        ids = tuple(group_member_id(group_id, n) for n in range(len(members)))
        members = [dataclasses.replace(item, message_id=job_id)
                   for item, job_id in zip(members, ids)]
        sender = then_to or self
        then_id, send = "", None
        if then is not None:
            then_item = then if isinstance(then, PushItem) else PushItem(then)
            then_id = group_then_id(group_id)
            send = sender._held_send(dataclasses.replace(then_item, message_id=then_id))
        retention = self._retention()
        # The record first: a producer that stops from here on leaves a group the sweeper
        # finishes (members never sent fail), never one nobody knows of.
        if not self.workflows.hold(GROUP + group_id, then_id, sender.channel, send, ids, "run",
                                   retention, sent=False):
            return Group(group_id, ids, then_id, duplicate=True)
        pushed = self.push_many(members)
        for failure in pushed.failures:
            self.workflows.settle(FinalOutcome(
                ids[failure.index], self.channel, Outcome.CANCELLED, time.time(),
                reason=f"never sent: {failure.code}: {failure.reason}"), retention)
        self.workflows.mark_sent(group_id)
        return Group(group_id, ids, then_id, tuple(pushed.failures), pushed=pushed)

    # -- push(depends_on=...) ----------------------------------------------------------------
    def _hold(self, item: PushItem, depends_on: Iterable[str], on_failure: str) -> PushedId:
        """Hold `item` until `depends_on` are final (see `BaseProducer.push`)."""
        if on_failure not in ON_DEPENDENCY_FAILURE:
            raise InvalidMessage(f"on_dependency_failure must be 'cancel' or 'run', got "
                                 f"{on_failure!r}")
        if isinstance(depends_on, str):
            raise InvalidMessage(f"depends_on must be a list of job ids, got {depends_on!r}")
        deps = list(dict.fromkeys(depends_on))
        if not 1 <= len(deps) <= MAX_DEPENDENCIES:
            raise InvalidMessage(f"depends_on must name 1 to {MAX_DEPENDENCIES} job ids, got "
                                 f"{len(deps)}")
        for dep in deps:
            check_id("depends_on", dep)
        job_id = item.message_id or uuid.uuid4().hex
        if job_id in deps:
            raise InvalidMessage(f"depends_on: job {job_id!r} cannot wait on itself")
        self._check_dependencies(deps)
        send = self._held_send(dataclasses.replace(item, message_id=job_id))
        held = self.workflows.hold(JOB + job_id, job_id, self.channel, send, deps, on_failure,
                                   self._retention())
        return PushedId(job_id, duplicate=not held)

    def _held_send(self, item: PushItem) -> HeldSend:
        """The send `item` waits to make: prepared as a push with dedup (its job id marked, so
        that its consumer runs it once), located, its body offloaded when large."""
        prepared, _ = self._prepare(0, dataclasses.replace(item, dedup=True))
        encoded: EncodedMessage = prepared.outgoing.encoded
        if encoded.size > HELD_INLINE_BYTES and "ExtendedPayloadSize" not in encoded.attributes:
            encoded = self._offload(encoded, encoded.body.encode("utf-8"))
        target = self._with_target(prepared.level, lambda found: found, "locating the target")
        if isinstance(target, TopicTarget):
            kind, where = "sns", target.arn
        else:
            assert isinstance(target, QueueTarget)
            kind, where = "sqs", target.url
        return HeldSend(kind, where, encoded.body, encoded.attributes,
                        prepared.outgoing.group_id, prepared.outgoing.dedup_id,
                        tracked=self.status is not None)

    def _retention(self) -> int:
        return self._channel_retention

    @functools.cached_property
    def _channel_retention(self) -> int:
        """How long a job of this channel may wait: its queue's retention (read once; an
        exchange, or a queue whose attributes cannot be read: the longest, 14 days). A member
        not final by then has left its queue unrun; its group expires."""
        retention = int(self._spec(self.channel).retention_seconds)
        target = self._with_target(self._level(None), lambda found: found,
                                   "locating the target")
        if isinstance(target, QueueTarget):
            try:
                retention = int(target.sqs.get_queue_attributes(
                    QueueUrl=target.url, AttributeNames=["MessageRetentionPeriod"])[
                    "Attributes"]["MessageRetentionPeriod"])
            except (ClientError, BotoCoreError, KeyError, ValueError):
                pass  # the longest: a held job expires late, never early
        return retention

    def _check_dependencies(self, deps: list[str]) -> None:
        """InvalidMessage naming depends_on for a dependency whose status records name a
        channel that does not keep results (it would never finish for its waiters). A job
        with no records yet (not pushed, or untracked) is not refused: it cannot be told."""
        status = StatusStore(self.clients, self.settings)
        for dep in deps:
            try:
                records = status.timeline(dep)
            except ChannelNotFound:  # no status table yet: no job has a record to tell by
                return
            if not records:
                continue
            channel = records[0].channel
            names = []
            for ordered in (False, True):
                try:
                    names.append(ChannelSpec(name=channel, namespace=self.settings.namespace,
                                             ordered=ordered).queue_name)
                except MessengerError:  # not a channel name this version knows: cannot tell
                    continue
            declared = [self._keeps_results.of_queue(name) for name in names]
            if False in declared and True not in declared:
                raise InvalidMessage(
                    f"depends_on: job {dep!r} runs on channel {channel!r}, which does not keep "
                    f"results (keep_results=False): nothing would tell its waiters it finished")
