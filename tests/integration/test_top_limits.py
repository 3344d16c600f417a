"""`messenger top` shows the channels' flow-control limits under the channels: each limit (set at
run time marked '*'), the consumers' current rate and the jobs waiting (local endpoint)."""

from __future__ import annotations

import time

from messenger import ChannelSpec
from messenger.jobs.limits import LimitStore
from messenger.operations.flow import channel_limits, namespace_limits
from messenger.provision import Provisioner
from messenger.tools import cli


def test_top_lists_each_limited_channel_with_its_rate_and_jobs_waiting(
        settings, clients, capsys, monkeypatch):
    # Given 'orders' declaring 50/s (then capped at 4 at run time, its consumers reporting),
    # 'jobs' with two priority levels declaring at most 3 at once, and 'mail' with no limit
    provisioner = Provisioner(clients, settings)
    provisioner.ensure_channel(ChannelSpec("orders", namespace=settings.namespace,
                                           rate_limit="50/s"))
    provisioner.ensure_channel(ChannelSpec("jobs", namespace=settings.namespace,
                                           priorities=("high", "low"), max_concurrency=3))
    provisioner.ensure_channel(ChannelSpec("mail", namespace=settings.namespace))
    store = LimitStore(clients, settings)
    store.ensure()
    store.set("orders", max_concurrency=4, by="ada")
    # (stamped an hour ahead: fresh however slowly the test runs)
    LimitStore(clients, settings, clock=lambda: time.time() + 3600).report(
        "orders", "task-1", 42.0, 7)

    # When top prints one snapshot
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["top", "--once"]) == 0
    out = capsys.readouterr().out

    # Then the flow-control table has the limited channels only, by name
    table = out[out.index("flow control"):]
    lines = [line.split() for line in table.splitlines()]
    assert ["orders", "50/s", "-", "4*", "42.0", "7"] in lines
    assert ["jobs", "-", "-", "3", "-", "-"] in lines
    assert not any(line and line[0] == "mail" for line in lines)
    assert [view.channel for view in namespace_limits(clients, settings)] == ["jobs", "orders"]
    # And a level's name gives its channel's limits
    view = channel_limits(clients, settings, "jobs-high")
    assert view is not None and view.channel == "jobs" and view.limits.max_concurrency == 3


def test_before_any_limits_table_a_channel_shows_its_declaration(settings, clients):
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        "orders", namespace=settings.namespace, tenant_rate_limit="2/s"))
    view = channel_limits(clients, settings, "orders")
    assert view is not None and str(view.limits.tenant_rate_limit) == "2/s"
    assert view.source("tenant_rate_limit") == "declared" and view.report.processes == 0
    assert channel_limits(clients, settings, "nosuch") is None
