"""The local endpoint's workflow sweeper: what the 15-minute operations run does on AWS.

Deployed, the queue alarm's `{"scope": "source"}` run sweeps the workflows
(`messenger.ops.workflow_sweep`), finishing what crashes left: outcomes no one applied, releases
left half-done, groups whose producer stopped, held jobs past their channel's retention. The
embedded endpoint (`messenger local`) has no such run, so it sweeps itself: every
`interval` seconds (default 60) it lists the DynamoDB tables and sweeps the namespace of each
workflows table (`<ns->messenger-workflows`). A sweep leaves items younger than
`SWEEP_GRACE_SECONDS` (10 minutes) to whoever is writing them, so a test's own items, and a
test that sweeps with a clock of its own, are never raced.
"""

from __future__ import annotations

import logging
import threading

from messenger.aws import ClientFactory
from messenger.channel import workflows_table_name
from messenger.ops.workflow_sweep import sweep_workflows
from messenger.settings import Settings

logger = logging.getLogger("messenger.tools.workflow_sweeper")

#: Seconds between sweeps (the deployed run's is 15 minutes; locally, sooner).
DEFAULT_INTERVAL = 60.0
#: The name of the default namespace's table; others are '<ns>-' and that.
TABLE_SUFFIX = workflows_table_name("")


def namespaces(table_names: list[str]) -> list[str]:
    """The namespaces whose workflows table is among `table_names` ('' for the default)."""
    found = []
    for name in table_names:
        if name == TABLE_SUFFIX:
            found.append("")
        elif name.endswith(f"-{TABLE_SUFFIX}"):
            namespace = name[: -len(TABLE_SUFFIX) - 1]
            if workflows_table_name(namespace) == name:
                found.append(namespace)
    return found


class WorkflowSweeper:
    """Sweeps every namespace's workflows on the endpoint at `url` every `interval` seconds."""

    def __init__(self, url: str, region: str = "us-east-1",
                 interval: float = DEFAULT_INTERVAL) -> None:
        # the endpoint's own clients: whatever credentials (none) the process has
        self.clients = ClientFactory(region, endpoint_url=url, access_key=("testing", "testing"))
        self.region = region
        self.interval = interval
        self.swept: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> dict[str, dict[str, int]]:
        """One sweep of every namespace: what each did (namespaces with nothing done left
        out)."""
        dynamodb = self.clients.client("dynamodb")
        names: list[str] = []
        for page in dynamodb.get_paginator("list_tables").paginate():
            names.extend(page.get("TableNames", []))
        done: dict[str, dict[str, int]] = {}
        for namespace in namespaces(names):
            settings = Settings.from_env(namespace=namespace, region=self.region,
                                         provisioning="verify")
            sweep = sweep_workflows(self.clients, settings)
            if sweep.error:  # a table reset or deleted meanwhile: the next pass sees
                logger.debug("sweeping namespace %r: %s", namespace, sweep.error)
            elif any(count for name, count in sweep.counts.items() if name != "looked"):
                done[namespace] = sweep.counts
                logger.info("swept the workflows of namespace %r: %s", namespace, sweep.counts)
        self.swept = done
        return done

    def start(self) -> WorkflowSweeper:
        self._thread = threading.Thread(target=self._run, name="messenger-workflow-sweeper",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except Exception as error:  # noqa: BLE001 - the endpoint goes on; the next pass
                logger.debug("workflow sweep pass failed: %s", error)
