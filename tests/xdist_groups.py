"""Which tests share a pytest-xdist worker under `--dist loadgroup`, decided by file path.

`make test` runs the suite on several workers; tests that share an expensive once-per-session
fixture run on one worker, so it is made once: the CDK synths (every tests/infra file), Chromium,
the podman image, the Spark sessions and the module-scoped moto fixtures. Every other test goes
to whichever worker is free; each worker has its own moto server (`local_endpoint`).

The groups are by path because xdist's controller, which schedules, sees only node ids.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from xdist.scheduler import LoadGroupScheduling

#: Path pattern (relative to the repository, fnmatch: `*` crosses `/`) -> group; first match wins.
XDIST_GROUPS = {
    "tests/infra/*": "cdk-synth",
    "tests/integration/test_consumer_container.py": "podman",
    "tests/integration/test_consumer_image.py": "podman",
    "tests/integration/test_spark.py": "spark",
    "tests/integration/test_emr_spark.py": "spark",
    "tests/integration/test_moto_sqs.py": "moto-sqs",
    "tests/integration/test_moto_tagging.py": "moto-tagging",
    # The naming rule for the tests that drive Chromium (the session fixture `browser`).
    "tests/*_browser.py": "browser",
}
#: A test that uses one of these session fixtures must sit in a file of its group (it fails at
#: setup otherwise: tests/conftest.py), so the path rules above cannot silently rot.
XDIST_FIXTURE_GROUPS = {"browser": "browser"}


def group_of(path: str) -> str | None:
    """The group of a test file (`tests/infra/test_x.py`), None for a test that runs anywhere."""
    return next((group for pattern, group in XDIST_GROUPS.items() if fnmatchcase(path, pattern)),
                None)


def misplaced(path: str, fixturenames: list[str]) -> list[str]:
    """What is wrong with a test of `path` using `fixturenames`: each group fixture it uses
    whose group its file is not in."""
    return [
        f"{path} uses the fixture `{fixture}` but is not in the group {group!r}: name the file "
        f"to match a pattern of that group in tests/xdist_groups.py (XDIST_GROUPS)"
        for fixture, group in XDIST_FIXTURE_GROUPS.items()
        if fixture in fixturenames and group_of(path) != group
    ]


class PathGroupScheduling(LoadGroupScheduling):
    """`--dist loadgroup` with the groups of `XDIST_GROUPS`, read from each node id's path.

    xdist's own loadgroup reads the group from an `@group` suffix its workers write to
    `item._nodeid`; pytest 9.2 no longer reads that attribute, so with pytest-xdist 3.8 no node id
    carries a group and every group's tests are spread over all workers, each making its own
    synths, browser and Spark session (pytest-xdist issue #1386, fixed by its PR #1388, not
    released yet). This class can go once a released pytest-xdist handles pytest 9.2: the marks
    tests/conftest.py adds are then enough.
    """

    def _split_scope(self, nodeid: str) -> str:
        """The work unit of a test: its group, or the node id itself (it runs anywhere)."""
        return group_of(nodeid.split("::", 1)[0]) or nodeid
