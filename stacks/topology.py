"""The app-wide topology lint: what no single construct can see on its own.

Every `Channel` and `ConsumerService` registers with the `Topology` of its app (one per construct
tree). At synthesis it reports, one error per finding, on the construct concerned and with the fix:
- two queues (DLQs included) or two topics with one physical name in one account and region,
  anywhere in the app (`payment_events.audit_log` and `order_events.audit_log` are both the queue
  `audit_log`; a channel `orders-dlq` is the dead-letter queue of `orders`);
- an exchange with both ordered and unordered channels (that would be two topics);
- (through `inspect_consumers`) a consumer class that cannot be imported from its image's code or
  disagrees with the channel it is deployed for (see `ConsumerService`).
It also keys exchange topics by environment, namespace, exchange and ordering, so a staging
channel never subscribes to prod's topic (`ExchangeTopic.of`).
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import jsii
from aws_cdk import CfnResource, Stack, Token
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct, IConstruct, IValidation

from stacks.consumer_check import inspect_consumers

#: (environment, namespace, exchange): one exchange of one namespace in one account and region.
ExchangeKey = tuple[str, str, str]

@dataclass(frozen=True)
class _Named:
    """A queue or topic with a literal physical name, and who answers for it."""

    kind: str  # "queue" or "topic"
    name: str
    environment: str
    resource: CfnResource
    owner: Construct | None  # the messenger construct that reports findings; None: foreign
    role: str  # "queue", "dead-letter queue", "topic"
    label: str  # whose it is: "channel 'orders'", "exchange 'events'", or the resource path


class Topology:
    """The messenger constructs of one app. Get it with `Topology.of(scope)`."""

    #: One per construct tree (node addresses are paths: every App root has the same one).
    _by_root: ClassVar[weakref.WeakKeyDictionary[IConstruct, Topology]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, root: IConstruct) -> None:
        self._root = weakref.ref(root)
        self._owners: dict[str, tuple[Construct, str, str]] = {}
        self._exchanges: dict[tuple[ExchangeKey, bool], Any] = {}
        self._exchange_channels: dict[tuple[ExchangeKey, bool], list[str]] = defaultdict(list)
        self._attached: set[str] = set()
        self._findings: dict[str, list[str]] | None = None
        self._requests: dict[Path, set[str]] = defaultdict(set)
        self._requirements: dict[Path, Path | None] = {}
        self._inspected: dict[Path, dict[str, dict[str, Any]]] = {}

    @classmethod
    def of(cls, scope: IConstruct) -> Topology:
        root = scope.node.root
        if root not in cls._by_root:
            cls._by_root[root] = Topology(root)
        return cls._by_root[root]

    # -- registration -----------------------------------------------------------------------
    def register(self, resource: CfnResource, owner: Construct, role: str, label: str) -> None:
        """`resource` (a queue or topic) is the `role` ('queue', 'dead-letter queue', 'topic')
        of `label` (e.g. "channel 'orders'"); `owner` reports its findings."""
        self._owners[resource.node.addr] = (owner, role, label)
        self.attach(owner)

    def attach(self, owner: Construct, *extra: Callable[[], list[str]]) -> None:
        """Report the lint's findings on `owner` (and the `extra` checks' errors)."""
        if owner.node.addr in self._attached:
            return
        self._attached.add(owner.node.addr)
        owner.node.add_validation(_Findings(self, owner, extra))

    @staticmethod
    def environment(scope: IConstruct) -> str:
        """Where a construct deploys ('aws://account/region', tokens for agnostic stacks)."""
        stack = Stack.of(scope)
        account = "unknown-account" if Token.is_unresolved(stack.account) else stack.account
        region = "unknown-region" if Token.is_unresolved(stack.region) else stack.region
        return f"aws://{account}/{region}"

    def exchange_key(self, scope: IConstruct, namespace: str, exchange: str) -> ExchangeKey:
        return (self.environment(scope), namespace, exchange)

    def find_exchange(self, key: ExchangeKey, ordered: bool) -> Any:
        return self._exchanges.get((key, ordered))

    def add_exchange(self, key: ExchangeKey, ordered: bool, topic: Any) -> None:
        self._exchanges[(key, ordered)] = topic

    def add_exchange_channel(self, key: ExchangeKey, ordered: bool, channel: str) -> None:
        self._exchange_channels[(key, ordered)].append(channel)

    # -- consumer classes -------------------------------------------------------------------
    def request_consumer(
        self, code_dir: Path, consumer_class: str, requirements: Path | None = None
    ) -> None:
        """`consumer_class` will be inspected (with the other classes of `code_dir`, at once);
        modules `requirements` provides may be absent where synth runs."""
        self._requests[code_dir].add(consumer_class)
        self._requirements[code_dir] = requirements

    def consumer_facts(self, code_dir: Path, consumer_class: str) -> dict[str, Any]:
        """What the class declares, or {'error': ...} when it cannot be imported from the code."""
        if code_dir not in self._inspected:
            classes = sorted(self._requests[code_dir] | {consumer_class})
            self._inspected[code_dir] = inspect_consumers(
                code_dir, classes, self._requirements.get(code_dir)
            )
        facts = self._inspected[code_dir].get(consumer_class)
        if facts is None:  # requested after the folder's batch ran
            facts = inspect_consumers(
                code_dir, [consumer_class], self._requirements.get(code_dir)
            )[consumer_class]
        return facts

    # -- findings ---------------------------------------------------------------------------
    def findings_for(self, owner: Construct) -> list[str]:
        if self._findings is None:
            self._findings = self._collect()
        return self._findings.get(owner.node.addr, [])

    def _named(self) -> list[_Named]:
        found = []
        root = self._root()
        assert root is not None, "the app is gone"
        for construct in root.node.find_all():
            if isinstance(construct, sqs.CfnQueue):
                kind, name = "queue", construct.queue_name
            elif isinstance(construct, sns.CfnTopic):
                kind, name = "topic", construct.topic_name
            else:
                continue
            if not isinstance(name, str) or Token.is_unresolved(name):
                continue  # generated or computed names cannot collide by construction
            owner, role, label = self._owners.get(
                construct.node.addr, (None, kind, construct.node.path)
            )
            found.append(_Named(kind, name, self.environment(construct), construct, owner, role,
                                label))
        return found

    def _collect(self) -> dict[str, list[str]]:
        findings: dict[str, list[str]] = defaultdict(list)
        first: dict[tuple[str, str, str], _Named] = {}
        # One finding per pair of owners, however many of their names collide.
        pairs: dict[tuple[str, str, str], list[tuple[_Named, _Named]]] = defaultdict(list)
        for named in self._named():
            key = (named.kind, named.environment, named.name)
            earlier = first.setdefault(key, named)
            if earlier is named:
                continue
            reporter = named.owner or earlier.owner
            if reporter is None:
                continue  # neither is a messenger construct: not ours to judge
            pairs[(reporter.node.addr, named.label, earlier.label)].append((named, earlier))
        for (reporter_addr, _, _), collisions in pairs.items():
            findings[reporter_addr].append(_collision(collisions))
        for (key, ordered), channels in self._exchange_channels.items():
            if ordered or (key, True) not in self._exchange_channels:
                continue
            topic = self._exchanges[(key, ordered)]
            environment, namespace, exchange = key
            fifo = self._exchange_channels[(key, True)]
            findings[topic.node.addr].append(
                f"exchange {exchange!r} (namespace {namespace!r}) has ordered channels "
                f"({', '.join(sorted(fifo))}) and unordered channels "
                f"({', '.join(sorted(channels))}): that would be two topics, '{exchange}' and "
                f"'{exchange}.fifo', and a producer reaches only one of them. Give every "
                f"channel of the exchange the same ChannelSpec.ordered, or use another "
                f"exchange name for the other kind."
            )
        return findings


def _collision(collisions: list[tuple[_Named, _Named]]) -> str:
    named, earlier = collisions[0]
    same = "; ".join(
        f"its {a.role} and the {b.role} of {b.label} are both {a.kind} {a.name!r}"
        for a, b in collisions
    )
    hint = ""
    if any({a.role, b.role} == {"queue", "dead-letter queue"} for a, b in collisions):
        hint = (" A queue name ending in '-dlq' is the dead-letter queue of the channel named "
                "without it.")
    return (
        f"{named.label} collides with {earlier.label} "
        f"({(earlier.owner or earlier.resource).node.path}): {same}. "
        f"SQS queue and SNS topic names are unique per account and region, so both would be "
        f"one resource (or the second deployment fails). Rename one of the channels, or deploy "
        f"them in different namespaces.{hint}"
    )


@jsii.implements(IValidation)
class _Findings:
    def __init__(
        self, topology: Topology, owner: Construct, extra: Sequence[Callable[[], list[str]]]
    ) -> None:
        self.topology = topology
        self.owner = owner
        self.extra = extra

    def validate(self) -> list[str]:
        errors = list(self.topology.findings_for(self.owner))
        for check in self.extra:
            errors.extend(check())
        return errors
