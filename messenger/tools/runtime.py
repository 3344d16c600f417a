"""What a one-shot `messenger` command needs: its settings and its clients, held to one budget.

A person waits at the terminal, so a command retries for `COMMAND_RETRY_BUDGET_SECONDS` unless
`MESSENGER_RETRY_BUDGET` says otherwise; an endpoint that is down ends the command in about that
long with one line (`messenger.tools.cli.main`). The budget bounds both the library's own retries
(`call_with_budget`, e.g. the requeuer's sends) and every other call of the command's clients
(`ClientFactory.call_budget`), which otherwise stop after the library's 20 s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from messenger.aws import ClientFactory
from messenger.settings import Settings

#: Seconds of retries of a command's AWS call when MESSENGER_RETRY_BUDGET is not set: a few
#: retries of a throttled or broken call, then the command says what happened.
COMMAND_RETRY_BUDGET_SECONDS = 5.0
RETRY_BUDGET_ENV = "MESSENGER_RETRY_BUDGET"


@dataclass(frozen=True)
class CommandRuntime:
    """Settings and clients of one command; the clients' per-call budget is the settings'."""

    settings: Settings
    clients: ClientFactory

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 region: str | None = None) -> CommandRuntime:
        """Settings from `environ` (default os.environ) with the command's retry budget (see
        the module); `region`: the clients' region instead of the settings' (a --region)."""
        env = os.environ if environ is None else environ
        overrides = {} if env.get(RETRY_BUDGET_ENV) else {
            "retry_budget_seconds": COMMAND_RETRY_BUDGET_SECONDS}
        settings = Settings.from_env(env, **overrides)
        clients = ClientFactory(region or settings.region,
                                call_budget=settings.retry_budget_seconds)
        return cls(settings, clients)


def budget_note(environ: Mapping[str, str] | None = None) -> str:
    """How long a command retried and how to make it wait longer, for its one line on an
    endpoint it could not reach."""
    env = os.environ if environ is None else environ
    given = env.get(RETRY_BUDGET_ENV)
    if given:
        return f"gave up within the {given.strip()} s retry budget of {RETRY_BUDGET_ENV}"
    return (f"gave up within the {COMMAND_RETRY_BUDGET_SECONDS:g} s retry budget; set "
            f"{RETRY_BUDGET_ENV} to wait longer")
