"""`make demo` says where its consumers' logs are, at its start and under its summary; on a
terminal it keeps what it made browsable (its endpoint and a dashboard) until stopped, elsewhere
it says that its endpoint stopped and how to get one that has its channels."""

from __future__ import annotations

import os
import re
import shutil
import urllib.request
from pathlib import Path
from unittest import mock

import pytest

from examples import demo
from messenger import ChannelSpec
from messenger.provision import Provisioner


def test_the_demo_prints_the_folder_its_logs_are_in(capsys: pytest.CaptureFixture[str]) -> None:
    # Given a demo of one step that writes a consumer log where the demo keeps them
    written: list[Path] = []

    def step(ctx: demo.DemoContext) -> str:
        (ctx.workdir / "OrdersConsumer.log").write_text("{}\n")
        written.append(ctx.workdir)
        return "wrote a log"

    with mock.patch.dict(os.environ):  # the demo points the environment at its own endpoint
        assert demo.run([("Write a log", step)]) == 0
    # Then that folder is named before the steps and again as the last line
    out = capsys.readouterr().out
    named = re.findall(r"^logs: (\S+)", out, re.MULTILINE)
    assert named == [str(written[0])] * 2, out
    assert out.rstrip().splitlines()[-1] == f"logs: {written[0]}"
    assert (Path(named[0]) / "OrdersConsumer.log").exists()
    shutil.rmtree(written[0])  # the demo keeps its logs for the user; the test does not


def test_not_on_a_terminal_the_demo_says_its_endpoint_stopped(capsys) -> None:
    with mock.patch.dict(os.environ):
        assert demo.run([("Nothing", lambda ctx: "done")]) == 0
    printed = capsys.readouterr().out
    shutil.rmtree(re.findall(r"^logs: (\S+)", printed, re.MULTILINE)[0])
    out = " ".join(printed.split())
    # It does not send the user to a new, empty endpoint; it says how to keep the demo's
    assert "The demo's endpoint has stopped, and its channels with it" in out
    assert "run `make demo` in a terminal" in out and "until you press Enter" in out
    assert "messenger local --port" not in out


@pytest.mark.timeout(600)  # a hang: starts an endpoint and a dashboard, each a process
def test_served_the_dashboard_it_points_to_shows_its_channels_until_stopped(capsys) -> None:
    # Given a demo whose step makes a channel, run as on a terminal (serve)
    def step(ctx: demo.DemoContext) -> str:
        Provisioner(ctx.clients, ctx.settings).ensure_channel(
            ChannelSpec("served_orders", namespace=demo.NAMESPACE))
        return "made a channel"

    seen: dict[str, str] = {}

    def browse(url: str) -> None:
        """The user, while the demo waits: opens the dashboard it printed, then presses Enter."""
        with urllib.request.urlopen(url, timeout=60) as page:
            seen["page"] = page.read().decode()
        seen["url"], seen["endpoint"] = url, os.environ["AWS_ENDPOINT_URL"]

    with mock.patch.dict(os.environ):
        assert demo.run([("Make a channel", step)], serve=True, until=browse) == 0
    out = capsys.readouterr().out
    # Then the page it pointed to listed the demo's channel, on the demo's endpoint
    assert seen["url"] and f"dashboard: {seen['url']}" in out, out
    assert 'data-channel="served_orders"' in seen["page"]
    assert f"AWS_ENDPOINT_URL={seen['endpoint']}" in out and "MESSENGER_NAMESPACE=demo" in out
    # and once stopped, the endpoint and the dashboard are gone
    assert out.rstrip().splitlines()[-1] == "endpoint and dashboard stopped"
    for gone in (seen["url"], seen["endpoint"]):
        with pytest.raises(OSError):
            urllib.request.urlopen(gone, timeout=10)
    shutil.rmtree(re.findall(r"^logs: (\S+)", out, re.MULTILINE)[0])
