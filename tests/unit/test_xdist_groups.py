"""`--dist loadgroup` keeps each group's tests on one worker (tests/xdist_groups.py)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

from tests.xdist_groups import PathGroupScheduling, misplaced

COLLECTION = [
    "tests/infra/test_services.py::test_a",
    "tests/infra/test_templates.py::test_b[platform]",
    "tests/infra/test_templates.py::test_b[examples]",
    "tests/integration/test_spark.py::test_c",
    "tests/integration/test_emr_spark.py::test_d",
    "tests/integration/test_dashboard_browser.py::test_e",
    "tests/integration/test_dashboard_features_browser.py::test_f",
    *(f"tests/unit/test_channel.py::test_{n}" for n in range(12)),
    "tests/integration/test_dashboard.py::test_g",
]


class Worker:
    """What the scheduler sees of a pytest-xdist worker: it is sent test indices to run."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.queue: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue += indices

    def shutdown(self) -> None:
        self.shutting_down = True


def run(collection: list[str]) -> dict[str, str]:
    """Schedule `collection` on two workers that each finish one test in turn: node id -> worker."""
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"],
                             option=SimpleNamespace(loadscopereorder=True))
    scheduler = PathGroupScheduling(config)  # type: ignore[arg-type]
    workers = [Worker("gw0"), Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)  # type: ignore[arg-type]
        scheduler.add_node_collection(worker, collection)  # type: ignore[arg-type]
    scheduler.schedule()
    ran = {}
    while any(worker.queue for worker in workers):
        for worker in workers:
            if worker.queue:
                index = worker.queue.pop(0)
                ran[collection[index]] = worker.gateway.id
                scheduler.mark_test_complete(worker, index)  # type: ignore[arg-type]
    return ran


def test_each_group_runs_on_one_worker_and_the_other_tests_anywhere():
    ran = run(COLLECTION)

    assert set(ran) == set(COLLECTION)
    by_group = defaultdict(set)
    for nodeid, worker in ran.items():
        group = ("cdk-synth" if "/infra/" in nodeid else "spark" if "spark" in nodeid
                 else "browser" if "_browser.py" in nodeid else nodeid)
        by_group[group].add(worker)
    assert by_group["cdk-synth"] and len(by_group["cdk-synth"]) == 1
    assert len(by_group["spark"]) == 1
    assert len(by_group["browser"]) == 1
    # The ungrouped tests are not kept together: each is a work unit of its own.
    assert {ran[nodeid] for nodeid in COLLECTION if "/unit/" in nodeid} == {"gw0", "gw1"}


def test_a_test_using_the_browser_outside_the_browser_group_is_named():
    assert misplaced("tests/integration/test_dashboard_browser.py", ["settings", "browser"]) == []
    assert misplaced("tests/integration/test_dashboard.py", ["settings"]) == []

    (problem,) = misplaced("tests/integration/test_dashboard.py", ["settings", "browser"])

    assert "tests/integration/test_dashboard.py uses the fixture `browser`" in problem
