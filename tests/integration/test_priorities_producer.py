"""Priority channels, producer side: each level is its own queue; exchanges route by attribute."""

from __future__ import annotations

import pytest

from messenger import ChannelSpec, InvalidChannelSpec, InvalidMessage, MultiProducer, Producer
from messenger.produce.producer import PushItem
from messenger.provision import Provisioner
from tests.integration.helpers import decode, drain

LEVELS = ("high", "default", "low")


class JobsProducer(Producer):
    channel = "jobs"
    priorities = LEVELS


class EventsProducer(MultiProducer):
    channel = "events"
    priorities = LEVELS


class PlainEventsProducer(MultiProducer):
    channel = "events"


def test_level_specs_name_queues_and_filter_by_priority():
    spec = ChannelSpec("events.jobs", priorities=LEVELS, namespace="ns")
    assert [s.queue_name for s in spec.level_specs()] == ["ns-jobs-high", "ns-jobs-default",
                                                          "ns-jobs-low"]
    assert [s.dlq_name for s in spec.level_specs()][0] == "ns-jobs-high-dlq"
    policies = [s.filter_policy() for s in spec.level_specs()]
    assert policies == [
        {"priority": ["high"]},
        {"priority": [{"exists": False}, "default"]},
        {"priority": ["low"]},
    ]
    assert spec.default_level == "default"
    assert ChannelSpec("q", priorities=("urgent", "later")).default_level == "later"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"priorities": ("only",)}, "2 to 10 levels"),
        ({"priorities": ("High", "low")}, "a-z, 0-9"),
        ({"priorities": ("a", "a")}, "twice"),
        ({"priorities": ("a", "b"), "default_priority": "c"}, "'c' is not one of a, b"),
        ({"default_priority": "a"}, "needs priorities"),
    ],
)
def test_bad_priorities_are_rejected(kwargs, fragment):
    with pytest.raises(InvalidChannelSpec, match=fragment):
        ChannelSpec("q", **kwargs)


def test_single_queue_levels_receive_their_pushes(settings, clients):
    producer = JobsProducer(settings=settings, clients=clients)
    producer.push({"n": 1}, priority="high")
    producer.push({"n": 2})
    producer.push_many([PushItem({"n": 3}, priority="low"), PushItem({"n": 4}, priority="high")])
    sqs = clients.client("sqs")
    got = {}
    for level in LEVELS:
        url = sqs.get_queue_url(QueueName=f"{settings.namespace}-jobs-{level}")["QueueUrl"]
        got[level] = sorted(decode(m).body["n"] for m in drain(sqs, url))
    assert got == {"high": [1, 4], "default": [2], "low": [3]}
    with pytest.raises(InvalidMessage, match="priority 'urgent' is not one of high, default, low"):
        producer.push({"n": 5}, priority="urgent")


def test_exchange_levels_route_by_attribute_and_unprioritized_go_to_default(settings, clients):
    spec = ChannelSpec("events.jobs", priorities=LEVELS, namespace=settings.namespace)
    resources = Provisioner(clients, settings).ensure_channel(spec)
    assert [r.queue.name for r in resources.levels] == [s.queue_name for s in spec.level_specs()]
    EventsProducer(settings=settings, clients=clients).push({"n": 1}, priority="low")
    EventsProducer(settings=settings, clients=clients).push({"n": 2}, priority="high")
    PlainEventsProducer(settings=settings, clients=clients).push({"n": 3})
    sqs = clients.client("sqs")
    got = {r.spec.priority_level: [decode(m).body["n"] for m in drain(sqs, r.queue.url)]
           for r in resources.levels}
    assert got == {"high": [2], "default": [3], "low": [1]}
    with pytest.raises(InvalidMessage, match="declares no priorities"):
        PlainEventsProducer(settings=settings, clients=clients).push({"n": 4}, priority="high")
