"""The dead-letter workbench: list, show, requeue and delete single dead letters of a channel.

    bench = DeadLetterWorkbench('orders')
    listing = bench.list(limit=50)          # messenger dlq list orders --limit 50
    letter = bench.show('order-42')         # messenger dlq show orders order-42
    bench.requeue(['order-42'])             # messenger dlq requeue orders order-42
    bench.delete(['order-7'])               # messenger dlq delete orders order-7 --yes

A channel is 'queue', 'exchange.queue' or a prioritized channel's name (every level's DLQ is read);
its DLQs are the ones its queues' redrive policies name. SQS has no way to read a queue without
receiving: a scan receives the messages, holds them (invisible for `visibility_timeout` seconds
plus 0.01 s per message the DLQ holds, so the hold outlasts the scan) while it reads on, and
releases them all at once at its end (visibility 0), also when it fails. A scan killed -9 leaves
them hidden until that timeout, never gone. What a scan could not see is
counted (`DeadLetterListing.not_seen`): messages in flight elsewhere, delayed, or, on a FIFO DLQ,
held back behind the scan's own messages of their group (SQS returns no more of a message group
while some of its messages are in flight: a scan sees about 10 per group per run).

A dead letter's id is its messenger `message_id` (what `push` returned, what `messenger status`
takes); the SQS MessageId works too. Requeue uses `Requeuer.move`, the rule of `messenger requeue`:
deleted from the DLQ only after the destination accepted it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from messenger.aws import ClientFactory, call_with_budget
from messenger.channel import (
    DLQ_SUFFIX,
    FIFO_SUFFIX,
    MAX_BATCH_ENTRIES,
    ROUTING_KEY_ATTRIBUTE,
    physical_name,
)
from messenger.errors import (
    ChannelNotFound,
    DeadLetterNotFound,
    InvalidSettings,
    MessageDecodeError,
    MessengerError,
)
from messenger.jobs.status import StatusRecord, StatusStore
from messenger.message import (
    DEAD_LETTER_FAILURE_ATTRIBUTE,
    DEAD_LETTER_REASON_ATTRIBUTE,
    MESSAGE_ID_ATTRIBUTE,
    META_HEADERS_ATTRIBUTE,
    PRODUCED_AT_ATTRIBUTE,
)
from messenger.offload import OffloadPointer, PayloadStore
from messenger.provision import Provisioner, QueueRef
from messenger.settings import Settings
from messenger.tools.requeue import MOVE_VISIBILITY_TIMEOUT, Requeuer, RequeueReport

#: What a dead letter moved by SQS's redrive (max_receives) says: no consumer forwarded it.
REDRIVE_REASON = "redrive: no consumer verdict"
_LEVEL = re.compile(r"[a-z0-9_]{1,16}")
#: A scan's hold grows by this many seconds per message it expects to read (10,000 read in
#: about 60 s on the local endpoint, fewer on SQS): the hold outlasts the scan.
SCAN_SECONDS_PER_MESSAGE = 0.01
# (`DeadLetterWorkbench.list` shadows the builtin inside the class.)
Received = list[dict[str, Any]]
Timeline = list[StatusRecord]
Reports = list[RequeueReport]
Found = list[tuple[dict[str, Any], str]]


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

    @property
    def ordered(self) -> bool:
        return self.dlq.name.endswith(FIFO_SUFFIX)


@dataclass
class _Scan:
    """The messages a scan holds, per source, until `release`."""

    held: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    not_seen: int = 0
    fifo_blocked: int = 0
    stopped_at_limit: bool = False


class DeadLetterWorkbench:
    """Reads and acts on single dead letters of one channel (see the module doc).

    channel: 'queue', 'exchange.queue', a prioritized channel's name, or a DLQ's own name.
    visibility_timeout: seconds a scanned message stays hidden if the scan dies (1-43200,
    default 60, plus 0.01 s per message in the DLQ; a scan releases what it holds as soon as
    it ends).
    """

    def __init__(
        self,
        channel: str,
        settings: Settings | None = None,
        clients: ClientFactory | None = None,
        visibility_timeout: int = MOVE_VISIBILITY_TIMEOUT,
    ) -> None:
        if not 1 <= visibility_timeout <= 43_200:
            raise InvalidSettings(
                f"visibility_timeout must be 1 to 43200 seconds, got {visibility_timeout}"
            )
        self.channel = channel
        self.settings = settings or Settings.from_env()
        self.clients = clients or ClientFactory(self.settings.region)
        self.visibility_timeout = visibility_timeout
        self.sqs = self.clients.client("sqs")
        self.provisioner = Provisioner(self.clients, self.settings)
        self.sources = self._resolve(channel)
        self._status: StatusStore | None | bool = False  # False: not looked up yet

    # -- finding the DLQs -------------------------------------------------------------------
    def _resolve(self, channel: str) -> list[_Source]:
        queue_part = channel.split(".")[-1]
        for suffix in (DLQ_SUFFIX + FIFO_SUFFIX, DLQ_SUFFIX):  # a DLQ named directly
            if queue_part.endswith(suffix):
                queue_part = queue_part[: -len(suffix)]
                break
        namespace = self.settings.namespace
        if namespace and queue_part.startswith(f"{namespace}-"):
            queue_part = queue_part[len(namespace) + 1 :]
        if not queue_part or not re.fullmatch(r"[A-Za-z0-9_-]+", queue_part):
            raise ChannelNotFound(f"channel {channel!r} is not a channel name ('queue' or "
                                  f"'exchange.queue')")
        base = physical_name(queue_part, namespace)
        urls = [url for page in self.sqs.get_paginator("list_queues").paginate(
            QueueNamePrefix=base) for url in page.get("QueueUrls", [])]
        sources = []
        for url in sorted(urls):
            name = url.rsplit("/", 1)[-1]
            plain = name.removesuffix(FIFO_SUFFIX)
            level = plain[len(base) + 1 :] if plain.startswith(f"{base}-") else None
            if plain != base and not (level and _LEVEL.fullmatch(level)) or \
                    plain.endswith(DLQ_SUFFIX):
                continue
            attributes = self.sqs.get_queue_attributes(
                QueueUrl=url, AttributeNames=["RedrivePolicy"]).get("Attributes", {})
            target = json.loads(attributes.get("RedrivePolicy") or "{}").get(
                "deadLetterTargetArn", "")
            if not target:
                continue
            dlq = self.provisioner.find_queue(str(target).rpartition(":")[2])
            if dlq is not None:
                sources.append(_Source(dlq, name))
        if not sources:
            raise ChannelNotFound(
                f"no channel {channel!r} with a DLQ in namespace {namespace or '(none)'!r} "
                f"(no queue {base!r} or '{base}-<level>' whose redrive policy names a DLQ)"
            )
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
        """Move exactly these dead letters back to their queues; DeadLetterNotFound (nothing
        moved) when one of them is not in a DLQ."""
        reports: Reports = []

        def move(source: _Source, messages: Received) -> None:
            destination = source.queue.removesuffix(FIFO_SUFFIX)
            if self.settings.namespace:
                destination = destination.removeprefix(f"{self.settings.namespace}-")
            requeuer = Requeuer(source.dlq.name, destination, ordered=source.ordered,
                                settings=self.settings, clients=self.clients,
                                visibility_timeout=self.visibility_timeout)
            reports.append(requeuer.move(messages))

        self._find(list(letter_ids), act=move)
        return reports

    def delete(self, letter_ids: Iterable[str]) -> int:
        """Delete exactly these dead letters; DeadLetterNotFound (nothing deleted) when one of
        them is not in a DLQ. Returns how many messages were deleted (duplicates included)."""
        deleted = 0

        def remove(source: _Source, messages: Received) -> None:
            nonlocal deleted
            for start in range(0, len(messages), MAX_BATCH_ENTRIES):
                chunk = messages[start : start + MAX_BATCH_ENTRIES]
                response = self._batch(
                    "delete_message_batch", source.dlq,
                    [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                     for i, m in enumerate(chunk)], "deleting from")
                deleted += len(response.get("Successful", []))

        self._find(list(letter_ids), act=remove)
        return deleted

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
            matches: dict[str, Received] = {}
            seen: set[str] = set()
            for dlq, messages in scan.held.items():
                for message in messages:
                    ids = _ids(message)
                    if ids & wanted:
                        seen |= ids & wanted
                        matches.setdefault(dlq, []).append(message)
            missing = sorted(wanted - seen)
            if missing:
                hint = f"; {scan.not_seen} message(s) could not be seen" if scan.not_seen else ""
                raise DeadLetterNotFound(
                    f"no dead letter {', '.join(map(repr, missing))} in {', '.join(self.dlqs)}"
                    f"{hint} (ids: the message id `messenger dlq list` shows, or the SQS "
                    f"MessageId); nothing changed"
                )
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
        id of `until_seen` is held); count what could not be seen."""
        remaining = set(until_seen or ())
        for source in self.sources:
            held = scan.held.setdefault(source.dlq.name, [])
            # Hold long enough for the whole scan (~SCAN_SECONDS_PER_MESSAGE each): a hold that
            # lapses mid-scan hands messages out twice (then the scan stops and says so).
            visible, _ = self._counts(source)
            hold = min(43_200, self.visibility_timeout + int(visible * SCAN_SECONDS_PER_MESSAGE))
            ids: set[str] = set()
            while True:
                total = sum(len(m) for m in scan.held.values())
                if limit is not None and total >= limit:
                    scan.stopped_at_limit = True
                    return
                if until_seen is not None and not remaining:
                    return
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
                    remaining -= _ids(message)
                if not fresh:
                    break  # only messages seen before: the whole queue has been read
            visible, invisible = self._counts(source)
            # Held by this scan: counted as invisible by SQS.
            scan.not_seen += visible + max(0, invisible - len(held))
            if source.ordered:
                scan.fifo_blocked += visible

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
        """Make every held message visible again at once (visibility 0)."""
        for source in self.sources:
            held = scan.held.get(source.dlq.name, [])
            for start in range(0, len(held), MAX_BATCH_ENTRIES):
                chunk = held[start : start + MAX_BATCH_ENTRIES]
                self._batch("change_message_visibility_batch", source.dlq,
                            [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"],
                              "VisibilityTimeout": 0} for i, m in enumerate(chunk)],
                            "releasing messages of")

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
                text = PayloadStore(self.clients.client("s3"), pointer.bucket).get(pointer)
            except MessengerError as error:
                return f"(offloaded body unavailable: {error})"
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


def _ids(message: dict[str, Any]) -> set[str]:
    ids = {str(message["MessageId"])}
    own = message.get("MessageAttributes", {}).get(MESSAGE_ID_ATTRIBUTE, {}).get("StringValue")
    if own:
        ids.add(str(own))
    return ids


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


# -- command line ---------------------------------------------------------------------------
def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def render_listing(listing: DeadLetterListing, width: int = 80) -> str:
    """Each letter within `width` columns: id, age, attempts and reason (on lines of its own
    when too long), then the error (type and the traceback's last line, or the status table's
    last error), wrapped, never cut."""
    lines = textwrap.wrap(listing.summary(), width)
    for letter in listing.letters:
        attempts = "-" if letter.attempts is None else str(letter.attempts)
        head = f"{letter.id[:32]:<32} {_age(letter.age_seconds()):>5} {attempts:>3}x "
        if len(head) + len(letter.reason) <= width:
            lines.append(head + letter.reason)
        else:
            lines.append(head.rstrip())
            lines += textwrap.wrap(letter.reason, width, initial_indent="    ",
                                   subsequent_indent="    ")
        detail = letter.traceback_line or (f"last recorded error: {letter.last_error}"
                                           if letter.last_error else "")
        lines += textwrap.wrap(detail, width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def render_letter(letter: DeadLetter, body: Any, timeline: list[StatusRecord]) -> str:
    from messenger.jobs.status import render_timeline

    rows = [
        ("id", letter.id), ("sqs message id", letter.sqs_message_id), ("dlq", letter.dlq),
        ("reason", letter.reason), ("age", _age(letter.age_seconds())),
        ("attempts", "-" if letter.attempts is None else str(letter.attempts)),
        ("error", f"{letter.error_type}: {letter.error_message}" if letter.error_type else ""),
        ("last recorded error", letter.last_error), ("failed at", letter.failed_at),
        ("consumer", letter.consumer), ("routing key", letter.routing_key or ""),
        ("headers", json.dumps(letter.meta_headers) if letter.meta_headers else ""),
        ("message group", letter.group_id or ""),
        ("offloaded", "yes (body read from S3)" if letter.offloaded else ""),
    ]
    out = [f"{name + ':':<21}{value}" for name, value in rows if value]
    out.append("body:")
    out.append(json.dumps(body, indent=2, ensure_ascii=False) if not isinstance(body, str)
               else body)
    if letter.traceback:
        out += ["traceback:", letter.traceback.rstrip()]
    if timeline:
        out += ["status:", render_timeline(letter.id, timeline)]
    return "\n".join(out)


def _confirm(question: str, yes: bool) -> bool:
    if yes:
        return True
    if not sys.stdin.isatty():
        raise InvalidSettings(f"{question.strip()} needs --yes when there is no terminal to ask")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def run_cli(args: argparse.Namespace) -> int:
    """`messenger dlq list|show|requeue|delete CHANNEL ...`."""
    bench = DeadLetterWorkbench(args.channel, visibility_timeout=args.visibility_timeout)
    if args.dlq_command == "list":
        listing = bench.list(limit=args.limit)
        if args.json:
            print(json.dumps({"dlqs": listing.dlqs, "not_seen": listing.not_seen,
                              "fifo_blocked": listing.fifo_blocked,
                              "stopped_at_limit": listing.stopped_at_limit,
                              "letters": [letter.as_dict() for letter in listing.letters]},
                             indent=2))
        else:
            print(render_listing(listing))
        return 0
    if args.dlq_command == "show":
        letter, body, timeline = bench.show(args.id)
        if args.json:
            print(json.dumps({**letter.as_dict(), "body": body,
                              "status": [asdict(r) for r in timeline]}, indent=2, default=str))
        else:
            print(render_letter(letter, body, timeline))
        return 0
    ids = list(dict.fromkeys(args.ids))
    if args.dlq_command == "requeue":
        reports = bench.requeue(ids)
        for report in reports:
            print(report.summary())
        return 0 if all(report.failed == 0 for report in reports) else 1
    if not _confirm(f"Delete {len(ids)} dead letter(s) from {', '.join(bench.dlqs)}?", args.yes):
        print("nothing deleted")
        return 1
    print(f"deleted {bench.delete(ids)} message(s) from {', '.join(bench.dlqs)}")
    return 0


def add_parser(commands: Any) -> None:
    dlq = commands.add_parser("dlq", help="list, show, requeue or delete single dead letters")
    actions = dlq.add_subparsers(dest="dlq_command", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("channel", help="'queue', 'exchange.queue' or a prioritized "
                                            "channel (every level's DLQ)")
        parser.add_argument("--visibility-timeout", type=int, default=MOVE_VISIBILITY_TIMEOUT,
                            metavar="SECONDS", help="seconds what a scan reads stays hidden "
                            "if the scan dies (default 60; released at its end)")
        parser.set_defaults(run=run_cli)

    listing = actions.add_parser("list", help="list the dead letters of a channel")
    common(listing)
    listing.add_argument("--limit", type=int, default=None, help="at most this many")
    listing.add_argument("--json", action="store_true", help="print JSON")
    show = actions.add_parser("show", help="one dead letter: body, headers, traceback, status")
    common(show)
    show.add_argument("id", help="the message id `dlq list` shows (or the SQS MessageId)")
    show.add_argument("--json", action="store_true", help="print JSON")
    requeue = actions.add_parser("requeue", help="move these dead letters back to their queue")
    common(requeue)
    requeue.add_argument("ids", nargs="+", metavar="ID")
    delete = actions.add_parser("delete", help="delete these dead letters (asks first)")
    common(delete)
    delete.add_argument("ids", nargs="+", metavar="ID")
    delete.add_argument("--yes", action="store_true", help="do not ask")
