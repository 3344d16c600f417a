"""A `messenger` command's settings and clients share one retry budget: the command's own by
default, MESSENGER_RETRY_BUDGET when it is set."""

from __future__ import annotations

from messenger.settings import DEFAULT_RETRY_BUDGET_SECONDS
from messenger.tools.runtime import COMMAND_RETRY_BUDGET_SECONDS, CommandRuntime, budget_note


def test_a_command_retries_for_its_own_budget_when_none_is_set() -> None:
    runtime = CommandRuntime.from_env({"AWS_DEFAULT_REGION": "eu-west-1"})
    assert COMMAND_RETRY_BUDGET_SECONDS < DEFAULT_RETRY_BUDGET_SECONDS
    assert runtime.settings.retry_budget_seconds == COMMAND_RETRY_BUDGET_SECONDS
    assert runtime.clients.call_budget == COMMAND_RETRY_BUDGET_SECONDS
    assert runtime.clients.region == "eu-west-1"
    assert "set MESSENGER_RETRY_BUDGET to wait longer" in budget_note({})


def test_messenger_retry_budget_sets_both_the_library_and_the_per_call_budget() -> None:
    runtime = CommandRuntime.from_env({"MESSENGER_RETRY_BUDGET": "45"}, region="us-west-2")
    assert runtime.settings.retry_budget_seconds == 45
    assert runtime.clients.call_budget == 45
    assert runtime.clients.region == "us-west-2"
    assert budget_note({"MESSENGER_RETRY_BUDGET": "45"}) == \
        "gave up within the 45 s retry budget of MESSENGER_RETRY_BUDGET"
