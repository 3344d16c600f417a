"""The dead-letter workbench: list, show, requeue and delete single dead letters of a channel.

    bench = DeadLetterWorkbench('orders')
    listing = bench.list(limit=50)          # messenger dlq list orders --limit 50
    letter = bench.show('order-42')         # messenger dlq show orders order-42
    bench.requeue(['order-42'])             # messenger dlq requeue orders order-42
    bench.delete(['order-7'])               # messenger dlq delete orders order-7 --yes

A channel is 'queue', 'exchange.queue' or a prioritized channel's name (every level's DLQ is read);
its queues are the ones its tags name (`messenger.operations.queues.channel_queues`: never by name
prefix), its DLQs the ones those queues' redrive policies name. SQS has no way to read a queue
without receiving: a scan receives the messages, holds them (invisible for `visibility_timeout`
seconds plus 0.01 s per message the DLQ holds, so the hold outlasts the scan) while it reads on,
and releases them all at once at its end (visibility 0), also when it fails. A scan killed -9
leaves them hidden until that timeout, never gone. What a scan could not see is counted
(`DeadLetterListing.not_seen`): messages in flight elsewhere, delayed, or, on a FIFO DLQ, held back
behind the scan's own messages of their group (SQS returns no more of a message group while some of
its messages are in flight: a scan sees about 10 per group per run).

A read over several DLQs (a prioritized channel's levels; `read_channels` for several channels)
scans them at once, at most MAX_CONCURRENT_SCANS at a time: each scan ends with a receive that
waits WaitTimeSeconds=1 and comes back empty (a long poll: SQS answers from all its servers, not
a sample), so N DLQs take about one such wait instead of N. The result is the same as one DLQ
after the other: letters in the order of the sources, each source's in SQS's order; the scan of
every source releases what it held, also when another's fails or the read is interrupted (the
others stop after their current request); the first failure in source order is raised; each
request keeps its retry budget. A read with a `limit` scans its DLQs one after the other: which
letters it returns from a DLQ depends on how many the DLQs before it held, known only once they
are read to their end (read at once, each could take up to `limit`, receiving and hiding more
than the limit, or return a mix that depends on timing).

A dead letter is named by its SQS MessageId (exactly one message), or by its messenger
`message_id` (what `push` returned, what `messenger status` takes) when that names one letter: two
dead letters can carry the same `message_id` (a job dead-lettered, requeued and dead-lettered
again while its first copy stayed), and then an action on that id raises AmbiguousDeadLetter
naming their MessageIds and changes nothing (a scan for a `message_id` reads the whole DLQs to
know it is alone; one for a MessageId stops when it is found). Requeue uses `Requeuer.move`, the
rule of `messenger requeue`: deleted from the DLQ only after the destination accepted it.

An offloaded body that is not UTF-8 is shown with its undecodable bytes escaped (`\\xNN`),
after a line that says so (`NOT_UTF8`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from messenger.aws import ClientFactory, call_with_budget
from messenger.channel import (
    FIFO_SUFFIX,
    MAX_BATCH_ENTRIES,
    ROUTING_KEY_ATTRIBUTE,
    SQS_MAX_RETENTION_SECONDS,
)
from messenger.errors import (
    ChannelNotFound,
    DeadLetterNotFound,
    InvalidSettings,
    MessageDecodeError,
    MessengerError,
)
from messenger.jobs.results import FinalOutcome, Outcome
from messenger.jobs.status import StatusEvent, StatusRecord, StatusStore
from messenger.jobs.workflows import Workflows
from messenger.message import (
    DEAD_LETTER_FAILURE_ATTRIBUTE,
    DEAD_LETTER_REASON_ATTRIBUTE,
    MESSAGE_ID_ATTRIBUTE,
    META_HEADERS_ATTRIBUTE,
    PRODUCED_AT_ATTRIBUTE,
)
from messenger.offload import OffloadPointer, PayloadStore
from messenger.operations.queues import channel_queues, dead_letter_queue
from messenger.operations.requeue import MOVE_VISIBILITY_TIMEOUT, Requeuer, RequeueReport
from messenger.provision import Provisioner, QueueRef
from messenger.settings import Settings

logger = logging.getLogger("messenger.deadletters")

#: What a dead letter moved by SQS's redrive (max_receives) says: no consumer forwarded it.
REDRIVE_REASON = "redrive: no consumer verdict"
#: The line before a body that is not UTF-8 (shown with its undecodable bytes as \\xNN).
NOT_UTF8 = "(offloaded body is not UTF-8: {size} bytes, undecodable ones shown as \\xNN)"
#: A scan's hold grows by this many seconds per message it expects to read (10,000 read in
#: about 60 s on the local endpoint, fewer on SQS): the hold outlasts the scan.
SCAN_SECONDS_PER_MESSAGE = 0.01
#: DLQs (or channels, `read_channels`) read at once: each scan ends with a 1 s long poll that
#: comes back empty, so N sources take about one poll instead of N. Each thread holds one HTTP
#: connection of the client's pool (50) while it polls.
MAX_CONCURRENT_SCANS = 4
T = TypeVar("T")
# (`DeadLetterWorkbench.list` shadows the builtin inside the class.)
Received = list[dict[str, Any]]
Timeline = list[StatusRecord]
Reports = list[RequeueReport]
Found = list[tuple[dict[str, Any], str]]


class AmbiguousDeadLetter(InvalidSettings):
    """A messenger message id names several dead letters: name one by its SQS MessageId."""


@dataclass(frozen=True)
class DeadLetter:
    """One message of a DLQ, parsed: who, why (the consumer's verdict), and where it came from.

    id: the messenger message id (the SQS MessageId for foreign messages). reason: the consumer's
    `dead_letter_reason`, or REDRIVE_REASON. error_type / error_message / traceback / attempts /
    failed_at / consumer: from the consumer's `dead_letter_failure` attribute ('' / None when
    absent). last_error: for a redriven letter, the last error the status table recorded.
    """

    id: str
    sqs_message_id: str
    dlq: str
    reason: str
    body: str
    produced_at: float | None = None
    sent_at: float | None = None
    attempts: int | None = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    failed_at: str = ""
    consumer: str = ""
    routing_key: str | None = None
    meta_headers: dict[str, str] = field(default_factory=dict)
    group_id: str | None = None
    sequence_number: str | None = None
    offloaded: bool = False
    last_error: str = ""

    @property
    def redriven(self) -> bool:
        return self.reason == REDRIVE_REASON

    def age_seconds(self, now: float | None = None) -> float | None:
        """Seconds since the message was produced (else since it was sent to its queue)."""
        start = self.produced_at or self.sent_at
        return None if start is None else max(0.0, (now or time.time()) - start)

    @property
    def traceback_line(self) -> str:
        """The traceback's last non-empty line (the exception), else the error."""
        lines = [line.strip() for line in self.traceback.splitlines() if line.strip()]
        if lines:
            return lines[-1]
        return f"{self.error_type}: {self.error_message}" if self.error_type else ""

    @classmethod
    def parse(cls, message: dict[str, Any], dlq: str) -> DeadLetter:
        """A received SQS message (MessageAttributes and Attributes 'All') as a dead letter."""
        attributes = message.get("MessageAttributes", {})
        system = message.get("Attributes", {})

        def text(name: str) -> str | None:
            value = attributes.get(name, {}).get("StringValue")
            return None if value is None else str(value)

        failure: dict[str, Any] = {}
        raw_failure = text(DEAD_LETTER_FAILURE_ATTRIBUTE)
        if raw_failure:
            try:
                loaded = json.loads(raw_failure)
                failure = loaded if isinstance(loaded, dict) else {}
            except ValueError:
                failure = {"error_message": f"(unreadable failure record: {raw_failure[:200]})"}
        try:
            headers = json.loads(text(META_HEADERS_ATTRIBUTE) or "{}")
        except ValueError:
            headers = {}
        produced = text(PRODUCED_AT_ATTRIBUTE)
        sent = system.get("SentTimestamp")
        attempts = failure.get("attempts")
        return cls(
            id=text(MESSAGE_ID_ATTRIBUTE) or str(message["MessageId"]),
            sqs_message_id=str(message["MessageId"]),
            dlq=dlq,
            reason=text(DEAD_LETTER_REASON_ATTRIBUTE) or REDRIVE_REASON,
            body=str(message.get("Body", "")),
            produced_at=_number(produced),
            sent_at=None if sent is None else float(sent) / 1000.0,
            attempts=attempts if isinstance(attempts, int) else None,
            error_type=str(failure.get("error_type") or ""),
            error_message=str(failure.get("error_message") or ""),
            traceback=str(failure.get("traceback") or ""),
            failed_at=str(failure.get("at") or ""),
            consumer=str(failure.get("consumer") or ""),
            routing_key=text(ROUTING_KEY_ATTRIBUTE),
            meta_headers=headers if isinstance(headers, dict) else {},
            group_id=system.get("MessageGroupId"),
            sequence_number=system.get("SequenceNumber"),
            offloaded=_pointer(message) is not None,
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "age_seconds": self.age_seconds(), "redriven": self.redriven}


@dataclass
class DeadLetterListing:
    """What a scan saw. not_seen: messages of the DLQs it could not read (in flight elsewhere,
    delayed, or held back behind its own in a FIFO group); stopped_at_limit: it read no further."""

    letters: list[DeadLetter] = field(default_factory=list)
    not_seen: int = 0
    fifo_blocked: int = 0
    stopped_at_limit: bool = False
    dlqs: list[str] = field(default_factory=list)

    def shared_ids(self) -> set[str]:
        """The message ids more than one listed letter carries (name those by their SQS
        MessageId)."""
        ids = [letter.id for letter in self.letters]
        return {i for i in ids if ids.count(i) > 1}

    def summary(self) -> str:
        line = f"{len(self.letters)} dead letter(s) in {', '.join(self.dlqs)}"
        if self.stopped_at_limit:
            line += " (stopped at --limit; there may be more)"
        if self.not_seen:
            line += f"; {self.not_seen} more could not be seen"
            if self.fifo_blocked:
                line += (f" ({self.fifo_blocked} behind the listed ones of their FIFO message "
                         f"group: SQS returns no more of a group while some of it is held)")
            else:
                line += " (in flight or delayed: another reader, or a killed run's, back soon)"
        return line


@dataclass(frozen=True)
class _Source:
    """One DLQ of the channel and the queue its letters go back to."""

    dlq: QueueRef
    queue: str  # physical name of the queue whose redrive names this DLQ
    destination: str  # the name of that queue's channel spec ('jobs-high'): where a requeue goes
    channel: str = ""  # the channel as its users name it ('jobs' for every level)
    keeps_results: bool = False  # its jobs' final outcomes are kept (`keep_results`)
    retention: int = SQS_MAX_RETENTION_SECONDS  # the queue's, as long as an outcome is kept

    @property
    def ordered(self) -> bool:
        return self.dlq.name.endswith(FIFO_SUFFIX)


@dataclass
class _Scan:
    """The messages a scan holds, per source (in the sources' order), until `release`; the
    sources' scans may run at once (`lock` guards the counts and `remaining`)."""

    held: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    not_seen: int = 0
    fifo_blocked: int = 0
    stopped_at_limit: bool = False
    remaining: set[str] = field(default_factory=set)  # SQS MessageIds wanted, not yet held
    stop: threading.Event = field(default_factory=threading.Event)  # another source failed
    lock: threading.Lock = field(default_factory=threading.Lock)


class DeadLetterWorkbench:
    """Reads and acts on single dead letters of one channel (see the module doc).

    channel: 'queue', 'exchange.queue', a prioritized channel's name, or a DLQ's own name.
    visibility_timeout: seconds a scanned message stays hidden if the scan dies (1-43200,
    default 60, plus 0.01 s per message in the DLQ; a scan releases what it holds as soon as
    it ends). actor: who acts (an operator's name), recorded on the REQUEUED and DELETED status
    records of the letters acted on (when the namespace tracks status).
    """

    def __init__(
        self,
        channel: str,
        settings: Settings | None = None,
        clients: ClientFactory | None = None,
        visibility_timeout: int = MOVE_VISIBILITY_TIMEOUT,
        actor: str = "",
    ) -> None:
        if not 1 <= visibility_timeout <= 43_200:
            raise InvalidSettings(
                f"visibility_timeout must be 1 to 43200 seconds, got {visibility_timeout}"
            )
        self.channel = channel
        self.settings = settings or Settings.from_env()
        self.clients = clients or ClientFactory(self.settings.region)
        self.visibility_timeout = visibility_timeout
        self.actor = actor
        self.sqs = self.clients.client("sqs")
        self.provisioner = Provisioner(self.clients, self.settings)
        try:
            self.sources = self._resolve(channel)
        except ChannelNotFound:
            self.sources = []
        if not self.sources:
            namespace = self.settings.namespace
            raise ChannelNotFound(
                f"no channel {channel!r} with a DLQ in namespace {namespace or '(none)'!r} (no "
                f"platform-owned queue tagged with it whose redrive policy names a DLQ)")
        self._status: StatusStore | None | bool = False  # False: not looked up yet

    # -- finding the DLQs -------------------------------------------------------------------
    def _resolve(self, channel: str) -> list[_Source]:
        sources = []
        for queue in channel_queues(self.clients, self.settings, channel):
            url = self.sqs.get_queue_url(QueueName=queue.queue)["QueueUrl"]
            attributes = self.sqs.get_queue_attributes(
                QueueUrl=url, AttributeNames=["RedrivePolicy", "MessageRetentionPeriod"]).get(
                "Attributes", {})
            name = dead_letter_queue(attributes)
            dlq = self.provisioner.find_queue(name) if name else None
            if dlq is not None:
                retention = int(attributes.get("MessageRetentionPeriod")
                                or SQS_MAX_RETENTION_SECONDS)
                sources.append(_Source(dlq, queue.queue, queue.queue_channel, queue.channel,
                                       queue.keeps_results, retention))
        return sources

    @property
    def dlqs(self) -> list[str]:
        return [source.dlq.name for source in self.sources]

    # -- the four operations ----------------------------------------------------------------
    def list(self, limit: int | None = None) -> DeadLetterListing:
        """The dead letters (every level's DLQ, each in the order SQS returns them: a FIFO
        DLQ's groups in their order), at most `limit`; what was read is released before this
        returns."""
        if limit is not None and limit < 1:
            raise InvalidSettings(f"limit must be >= 1, got {limit}")
        scan = _Scan()
        try:
            self._scan(scan, limit)
        finally:
            self._release(scan)
        letters = [DeadLetter.parse(message, dlq) for dlq, messages in scan.held.items()
                   for message in messages]
        letters = [self._with_last_error(letter) for letter in letters]
        return DeadLetterListing(letters, scan.not_seen, scan.fifo_blocked,
                                 scan.stopped_at_limit, self.dlqs)

    def show(self, letter_id: str) -> tuple[DeadLetter, Any, Timeline]:
        """One dead letter, its body (offload resolved, decoded from JSON when it is) and its
        status timeline (empty when the channel does not track status)."""
        found, _ = self._find([letter_id], act=None)
        message, dlq = found[0]
        letter = self._with_last_error(DeadLetter.parse(message, dlq))
        return letter, self._body(message), self._timeline(letter.id)

    def requeue(self, letter_ids: Iterable[str]) -> Reports:
        """Move exactly these dead letters back to their queues, one message per id;
        DeadLetterNotFound when one of them is not in a DLQ, AmbiguousDeadLetter when one names
        several (nothing moved)."""
        reports: Reports = []

        def move(source: _Source, messages: Received) -> None:
            requeuer = Requeuer(source.dlq.name, source.destination, ordered=source.ordered,
                                settings=self.settings, clients=self.clients,
                                visibility_timeout=self.visibility_timeout, actor=self.actor)
            reports.append(requeuer.move(messages))

        self._find(list(letter_ids), act=move)
        return reports

    def delete(self, letter_ids: Iterable[str]) -> int:
        """Delete exactly these dead letters, one message per id; DeadLetterNotFound when one of
        them is not in a DLQ, AmbiguousDeadLetter when one names several (nothing deleted).
        Returns how many messages were deleted: a letter SQS refused to delete (a Failed entry
        of DeleteMessageBatch) is not counted, stays in its DLQ (visible again at once) and is
        logged; fewer than the ids named means some were refused."""
        deleted = 0

        def remove(source: _Source, messages: Received) -> None:
            nonlocal deleted
            for start in range(0, len(messages), MAX_BATCH_ENTRIES):
                chunk = messages[start : start + MAX_BATCH_ENTRIES]
                self._settle_deleted(chunk, source)
                response = self._batch(
                    "delete_message_batch", source.dlq,
                    [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                     for i, m in enumerate(chunk)], "deleting from")
                # Only what SQS lists as Successful is gone; a refused entry (Failed) is still
                # in the DLQ: not counted, no DELETED record, and released at once (visible
                # again, not left hidden till the scan's hold ends).
                done = {int(entry["Id"]) for entry in response.get("Successful", [])}
                deleted += len(done)
                self._record_deleted([chunk[i] for i in sorted(done)], source)
                refused = [(chunk[i], failure) for failure in response.get("Failed", [])
                           if (i := int(failure["Id"])) not in done]
                for message, failure in refused:
                    logger.warning("dead letter %s not deleted from %s: %s %s",
                                   message["MessageId"], source.dlq.name,
                                   failure.get("Code", ""), failure.get("Message", ""))
                self._give_back(source, [message for message, _ in refused])

        self._find(list(letter_ids), act=remove)
        return deleted

    def _settle_deleted(self, messages: Received, source: _Source) -> None:
        """On a channel that keeps results: each letter's final outcome DELETED (its error and
        dead-letter reason kept), and what waits on it advanced (`Workflows.settle`), BEFORE it
        leaves the DLQ, as a consumer writes an outcome before its delete: a failure here
        deletes nothing (delete again), and no crash leaves a waiter on a letter gone. A letter
        SQS then refuses to delete stays in the DLQ, final all the same; requeued and run, its
        new outcome is recorded late (`jobs.workflows`)."""
        if not source.keeps_results or not messages:
            return
        workflows = Workflows(self.clients, self.settings)
        by = self.actor or "an operator"
        for message in messages:
            letter = DeadLetter.parse(message, source.dlq.name)
            workflows.settle(FinalOutcome(
                letter.id, source.channel or source.destination, Outcome.DELETED, time.time(),
                error_type=letter.error_type, error=letter.error_message,
                reason=f"deleted from its DLQ by {by} (dead-lettered: {letter.reason})"),
                source.retention)

    def _record_deleted(self, messages: Received, source: _Source) -> None:
        """DELETED (with who did it) on each deleted letter's timeline, when status is kept."""
        store = self._store() if messages else None
        if store is None:
            return
        for message in messages:
            store.record(StatusRecord(_message_id(message) or str(message["MessageId"]),
                                      StatusEvent.DELETED, source.destination,
                                      actor=self.actor))
        store.flush()

    # -- scanning ---------------------------------------------------------------------------
    def _find(
        self, letter_ids: Iterable[str],
        act: Callable[[_Source, Received], None] | None,
    ) -> tuple[Found, _Scan]:
        """Scan until every id is seen (or the DLQs are read); raise DeadLetterNotFound before
        acting when one is missing; else `act` on each source's matching messages. Whatever is
        held and not acted on is released."""
        wanted: set[str] = set(letter_ids)
        if not wanted:
            raise InvalidSettings("name at least one dead letter id")
        scan = _Scan()
        try:
            self._scan(scan, None, until_seen=wanted)
            candidates = [(m, dlq) for dlq, messages in scan.held.items() for m in messages]
            picked: dict[str, tuple[dict[str, Any], str]] = {}  # by SQS MessageId
            missing: list[str] = []
            ambiguous: list[str] = []
            for letter_id in sorted(wanted):
                named = [(m, d) for m, d in candidates if m["MessageId"] == letter_id] or [
                    (m, d) for m, d in candidates if _message_id(m) == letter_id]
                if not named:
                    missing.append(letter_id)
                elif len(named) > 1:
                    sqs_ids = ", ".join(sorted(m["MessageId"] for m, _ in named))
                    ambiguous.append(f"{letter_id!r} names {len(named)} dead letters (SQS "
                                     f"MessageIds {sqs_ids})")
                else:
                    picked[named[0][0]["MessageId"]] = named[0]
            if missing:
                hint = f"; {scan.not_seen} message(s) could not be seen" if scan.not_seen else ""
                raise DeadLetterNotFound(
                    f"no dead letter {', '.join(map(repr, missing))} in {', '.join(self.dlqs)}"
                    f"{hint} (ids: the message id `messenger dlq list` shows, or the SQS "
                    f"MessageId); nothing changed"
                )
            if ambiguous:
                raise AmbiguousDeadLetter(f"{'; '.join(ambiguous)}: name one by its SQS "
                                          f"MessageId; nothing changed")
            matches: dict[str, Received] = {}
            for message, dlq in picked.values():
                matches.setdefault(dlq, []).append(message)
            if act is not None:
                for source in self.sources:
                    chosen = matches.get(source.dlq.name)
                    if chosen:
                        act(source, chosen)
                        # Acted on: no longer ours to release (deleted, or left to its timeout).
                        held = scan.held[source.dlq.name]
                        scan.held[source.dlq.name] = [m for m in held if m not in chosen]
            return [(m, dlq) for dlq, ms in matches.items() for m in ms], scan
        finally:
            self._release(scan)

    def _scan(self, scan: _Scan, limit: int | None, until_seen: set[str] | None = None) -> None:
        """Receive and hold every reachable message of each DLQ (stop at `limit`, or once every
        SQS MessageId of `until_seen` is held: a messenger message id may name several, so
        it reads on); count what could not be seen. Without a limit the DLQs are scanned at
        once (the module doc says why a limit reads them in turn)."""
        for source in self.sources:  # held in the sources' order, whichever scan ends first
            scan.held.setdefault(source.dlq.name, [])
        scan.remaining = set(until_seen or ())
        if limit is not None or len(self.sources) == 1:
            for source in self.sources:
                if not self._scan_source(scan, source, limit, until_seen is not None):
                    return
            return
        run_concurrently([partial(self._scan_source, scan, source, None, until_seen is not None)
                          for source in self.sources], scan.stop)

    def _scan_source(self, scan: _Scan, source: _Source, limit: int | None,
                     until_seen: bool) -> bool:
        """Scan one DLQ into `scan`; False when the read should go no further (at `limit`,
        every wanted id held, or `scan.stop` set)."""
        held = scan.held[source.dlq.name]
        # Hold long enough for the whole scan (~SCAN_SECONDS_PER_MESSAGE each): a hold that
        # lapses mid-scan hands messages out twice (then the scan stops and says so).
        visible, _ = self._counts(source)
        hold = min(43_200, self.visibility_timeout + int(visible * SCAN_SECONDS_PER_MESSAGE))
        ids: set[str] = set()
        while True:
            if scan.stop.is_set():
                return False
            # With a limit the sources are read in turn: no other scan adds to the total.
            total = sum(len(m) for m in scan.held.values())
            if limit is not None and total >= limit:
                scan.stopped_at_limit = True
                return False
            with scan.lock:
                if until_seen and not scan.remaining:
                    return False
            count = MAX_BATCH_ENTRIES if limit is None else min(MAX_BATCH_ENTRIES,
                                                                 limit - total)
            messages = self._receive(source, count, hold)
            fresh = [m for m in messages if m["MessageId"] not in ids]
            if not messages:
                break
            for message in messages:
                if message["MessageId"] in ids:  # its hold lapsed during a long scan
                    held[:] = [m for m in held if m["MessageId"] != message["MessageId"]]
                ids.add(message["MessageId"])
                held.append(message)
                with scan.lock:
                    scan.remaining.discard(message["MessageId"])
            if not fresh:
                break  # only messages seen before: the whole queue has been read
        visible, invisible = self._counts(source)
        with scan.lock:
            # Held by this scan: counted as invisible by SQS.
            scan.not_seen += visible + max(0, invisible - len(held))
            if source.ordered:
                scan.fifo_blocked += visible
        return True

    def _receive(self, source: _Source, count: int, hold: int) -> Received:
        response = self._call(lambda: self.sqs.receive_message(
            QueueUrl=source.dlq.url, MaxNumberOfMessages=count,
            MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"],
            VisibilityTimeout=hold, WaitTimeSeconds=1,
        ), f"reading {source.dlq.name!r}")
        return list(response.get("Messages", []))

    def _counts(self, source: _Source) -> tuple[int, int]:
        """(visible, in flight + delayed) now."""
        attributes = self._call(lambda: self.sqs.get_queue_attributes(
            QueueUrl=source.dlq.url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                            "ApproximateNumberOfMessagesDelayed"],
        )["Attributes"], f"counting {source.dlq.name!r}")
        return int(attributes.get("ApproximateNumberOfMessages", 0)), int(
            attributes.get("ApproximateNumberOfMessagesNotVisible", 0)) + int(
            attributes.get("ApproximateNumberOfMessagesDelayed", 0))

    def _release(self, scan: _Scan) -> None:
        """Make every held message visible again at once (visibility 0): every source's, also
        when releasing another's fails (the first failure is raised after)."""
        failures: list[Exception] = []
        for source in self.sources:
            held = scan.held.get(source.dlq.name, [])
            for start in range(0, len(held), MAX_BATCH_ENTRIES):
                chunk = held[start : start + MAX_BATCH_ENTRIES]
                try:
                    self._batch("change_message_visibility_batch", source.dlq,
                                [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"],
                                  "VisibilityTimeout": 0} for i, m in enumerate(chunk)],
                                "releasing messages of")
                except Exception as failure:  # left to its hold's end; release the rest
                    failures.append(failure)
                    break
        if failures:
            raise failures[0]

    def _give_back(self, source: _Source, messages: Received) -> None:
        """Make these held messages visible again at once; a failure is logged (they come
        back when their hold ends)."""
        if not messages:
            return
        try:
            self._batch("change_message_visibility_batch", source.dlq,
                        [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                         for i, m in enumerate(messages)], "releasing messages of")
        except Exception as error:  # the delete's outcome stands; they come back later
            logger.warning("could not release %d dead letter(s) of %s: %s", len(messages),
                           source.dlq.name, error)

    def _batch(self, operation: str, queue: QueueRef, entries: Received, what: str) -> Any:
        """One batch call (`operation`) on `queue` within the retry budget."""
        return self._call(lambda: getattr(self.sqs, operation)(QueueUrl=queue.url,
                                                               Entries=entries),
                          f"{what} {queue.name!r}")

    def _call(self, call: Callable[[], Any], what: str) -> Any:
        return call_with_budget(call, self.settings.retry_budget_seconds, what)

    # -- details ----------------------------------------------------------------------------
    def _body(self, message: dict[str, Any]) -> Any:
        text = str(message.get("Body", ""))
        try:
            pointer = _pointer(message)
        except MessageDecodeError as error:
            return f"(malformed offload pointer: {error}) {text}"
        if pointer is not None:
            try:
                data = PayloadStore(self.clients.client("s3"), pointer.bucket).get_bytes(pointer)
            except MessengerError as error:
                return f"(offloaded body unavailable: {error})"
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                escaped = data.decode("utf-8", errors="backslashreplace")
                return f"{NOT_UTF8.format(size=len(data))}\n{escaped}"
        try:
            return json.loads(text)
        except ValueError:
            return text

    def _store(self) -> StatusStore | None:
        if self._status is False:
            store = StatusStore(self.clients, self.settings)
            self._status = store if store.exists() else None
        return self._status if isinstance(self._status, StatusStore) else None

    def _timeline(self, message_id: str) -> Timeline:
        store = self._store()
        return [] if store is None else store.timeline(message_id)

    def _with_last_error(self, letter: DeadLetter) -> DeadLetter:
        """A redriven letter carries no verdict: add the last error the status table has."""
        if not letter.redriven or self._store() is None:
            return letter
        errors = [r for r in self._timeline(letter.id) if r.error_class or r.error]
        if not errors:
            return letter
        last = errors[-1]
        text = f"{last.error_class}: {last.error}" if last.error_class else last.error
        return replace(letter, last_error=text)


def read_channels(channels: Sequence[str], read: Callable[[str], T]) -> list[T]:
    """`read(channel)` for each channel (a workbench's list or show), at most
    MAX_CONCURRENT_SCANS at once; the results in the channels' order. Each read releases what
    it held; when one raises, the others still run to their end and the first failure in the
    channels' order is raised (catch what a channel may answer, e.g. ChannelNotFound, in
    `read`)."""
    return run_concurrently([partial(read, channel) for channel in channels])


def run_concurrently(tasks: Sequence[Callable[[], T]],
                     stop: threading.Event | None = None) -> list[T]:
    """Run `tasks` on at most MAX_CONCURRENT_SCANS threads; their results in their order. When
    one fails, or the caller is interrupted (KeyboardInterrupt), `stop` is set (tasks that check
    it end after their current request) and every task is waited for before the first failure
    in the tasks' order is raised: what a task holds is released by its caller after."""
    if len(tasks) <= 1:
        return [task() for task in tasks]
    stop = stop or threading.Event()
    pool = ThreadPoolExecutor(min(MAX_CONCURRENT_SCANS, len(tasks)),
                              thread_name_prefix="messenger-dlq-scan")
    futures: list[Future[T]] = []
    try:
        futures = [pool.submit(task) for task in tasks]
        wait(futures, return_when=FIRST_EXCEPTION)
    finally:
        stop.set()  # after a failure or an interrupt: the others end after their request
        pool.shutdown(wait=True)  # every task ends before what it held is released
    return [future.result() for future in futures]


def _message_id(message: dict[str, Any]) -> str | None:
    """The messenger message id a received message carries (None for a foreign message)."""
    own = message.get("MessageAttributes", {}).get(MESSAGE_ID_ATTRIBUTE, {}).get("StringValue")
    return str(own) if own else None


def _pointer(message: dict[str, Any]) -> OffloadPointer | None:
    try:
        return OffloadPointer.parse(str(message.get("Body", "")),
                                    message.get("MessageAttributes"))
    except MessageDecodeError:
        return None


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None
