"""`messenger limits set|show` on the local endpoint: limits changed at run time over a channel's
declaration, read back as consumers read them (`LimitStore.get`), and bad input refused with
one line naming the option (exit 2) before any AWS call."""

from __future__ import annotations

import json

import pytest

from messenger import ChannelSpec
from messenger.channel import Rate
from messenger.jobs.limits import LimitStore
from messenger.provision import Provisioner
from messenger.tools import cli


@pytest.fixture
def orders(settings, clients, monkeypatch):
    """'orders' declaring 50/s per channel and 2/s per tenant, provisioned (its queue carries
    the declaration in its tags); the commands run in the test's namespace."""
    Provisioner(clients, settings).ensure_channel(ChannelSpec(
        "orders", namespace=settings.namespace, rate_limit="50/s", tenant_rate_limit="2/s"))
    monkeypatch.setenv("MESSENGER_NAMESPACE", settings.namespace)
    store = LimitStore(clients, settings)
    store.ensure()
    return store


def _json(capsys, *args: str) -> dict:
    assert cli.main(["limits", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_show_prints_the_declaration_when_nothing_was_set(orders, capsys):
    shown = _json(capsys, "show", "orders")
    assert shown["limits"] == {
        "rate_limit": {"value": "50/s", "source": "declared", "declared": "50/s"},
        "tenant_rate_limit": {"value": "2/s", "source": "declared", "declared": "2/s"},
        "max_concurrency": {"value": None, "source": "", "declared": None},
    }
    assert shown["set_by"] is None and shown["jobs_waiting"] == 0
    # And as text: one line per limit, where it comes from
    assert cli.main(["limits", "show", "orders"]) == 0
    text = capsys.readouterr().out
    assert "rate_limit         50/s     declared" in text
    assert "max_concurrency    none     not declared" in text
    assert "no consumer reported" in text


def test_set_overrides_the_declaration_and_consumers_read_it(orders, capsys):
    # When an operator lowers the channel's rate and caps its concurrency
    shown = _json(capsys, "set", "orders", "--rate", "100/min", "--max-concurrency", "5",
                  "--as", "ada")
    # Then show says so, who did it, and the declaration beside it
    assert shown["limits"]["rate_limit"] == {"value": "100/min", "source": "set",
                                             "declared": "50/s"}
    assert shown["limits"]["max_concurrency"] == {"value": "5", "source": "set",
                                                  "declared": None}
    assert shown["limits"]["tenant_rate_limit"]["source"] == "declared"
    assert shown["set_by"] == "ada" and shown["set_at"] > 0
    # And what a consumer reads now is the new limits
    limits = orders.get("orders")
    assert limits.rate_limit == Rate(100, 60, "min") and limits.max_concurrency == 5
    assert limits.tenant_rate_limit == Rate(2, 1, "s")
    assert "last change by ada" in "\n".join(
        (cli.main(["limits", "show", "orders"]), capsys.readouterr().out)[1:])


def test_none_sets_a_limit_off_and_clear_gives_back_the_declaration(orders, capsys):
    # Given the channel rate limit set off, whatever the declaration
    shown = _json(capsys, "set", "orders", "--rate", "none")
    assert shown["limits"]["rate_limit"] == {"value": None, "source": "set",
                                             "declared": "50/s"}
    assert orders.get("orders").rate_limit is None
    # When it is cleared, Then the declaration holds again
    shown = _json(capsys, "set", "orders", "--clear", "rate")
    assert shown["limits"]["rate_limit"] == {"value": "50/s", "source": "declared",
                                             "declared": "50/s"}
    assert orders.get("orders").rate_limit == Rate(50, 1, "s")


@pytest.mark.parametrize(("args", "said"), [
    (["--rate", "5/day"], "--rate: rate_limit must be 'N/s', 'N/min' or 'N/h'"),
    (["--tenant-rate", "0/s"], "--tenant-rate: tenant_rate_limit must be 'N/s'"),
    (["--max-concurrency", "0"], "--max-concurrency: max_concurrency must be a whole number "
                                 "from 1 to 10000, or 'none'"),
    (["--max-concurrency", "many"], "--max-concurrency: max_concurrency must be a whole number"),
    (["--clear", "speed"], "--clear must name rate, tenant-rate, max-concurrency, got 'speed'"),
    (["--rate", "5/s", "--clear", "rate"], "--rate is both set and cleared"),
    ([], "limits set needs --rate, --tenant-rate, --max-concurrency or --clear"),
])
def test_bad_values_are_one_line_naming_the_option_and_exit_2(orders, capsys, args, said):
    assert cli.main(["limits", "set", "orders", *args]) == 2
    err = capsys.readouterr().err
    assert said in err and err.strip().count("\n") == 0, err
    # nothing was written
    assert orders.show("orders").overrides == {}


def test_an_unknown_channel_is_refused_not_limited(orders, capsys):
    assert cli.main(["limits", "set", "ordres", "--rate", "1/s"]) == 2
    err = capsys.readouterr().err
    assert "no channel 'ordres'" in err and err.strip().count("\n") == 0, err
    assert cli.main(["limits", "show", "ordres"]) == 2


def test_a_channel_declaring_no_limit_is_refused_a_run_time_limit(
        orders, settings, clients, capsys):
    # Given 'mail', declaring no limit: its consumers run no limit gate
    Provisioner(clients, settings).ensure_channel(ChannelSpec("mail",
                                                              namespace=settings.namespace))
    assert cli.main(["limits", "set", "mail", "--max-concurrency", "3"]) == 2
    err = capsys.readouterr().err
    assert "channel 'mail' declares no limit, so its consumers read none at run time" in err
    assert err.strip().count("\n") == 0
    assert orders.show("mail").overrides == {}
    # show still answers: nothing limits it
    shown = _json(capsys, "show", "mail")
    assert {field["value"] for field in shown["limits"].values()} == {None}
