"""`make demo` says where its consumers' logs are, at its start and under its summary."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from unittest import mock

import pytest

from examples import demo


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
