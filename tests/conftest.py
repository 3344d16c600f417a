"""Shared fixtures: one moto server (a child process on a free loopback port) per session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from messenger.aws import ClientFactory
from messenger.produce.producer import BaseProducer
from messenger.settings import Settings
from messenger.tools.local import LOCAL_CREDENTIALS, LocalProcess, reset, start_local_process
from tests.xdist_groups import PathGroupScheduling, group_of, misplaced

# Never reach real AWS from a test, whatever the developer's shell has.
for _name in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
    os.environ.pop(_name, None)
os.environ.update(LOCAL_CREDENTIALS)


#: Per test: the group session fixtures it uses from outside their group (tests/xdist_groups.py).
MISPLACED = pytest.StashKey[list[str]]()


# tryfirst: pytest-xdist's worker reads the xdist_group marks in its own
# pytest_collection_modifyitems; it is registered after this conftest, so without tryfirst it
# runs first and sees no marks. With pytest 9.2 and pytest-xdist 3.8 the marks do not keep a group
# on one worker (pytest-xdist issue #1386): `pytest_xdist_make_scheduler` below does.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its xdist group (tests/xdist_groups.py)."""
    root = Path(str(config.rootpath))
    for item in items:
        path = Path(str(item.path)).relative_to(root).as_posix()
        item.stash[MISPLACED] = misplaced(path, item.fixturenames)
        group = group_of(path)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that uses a group's session fixture from a file outside the group fails (at setup:
    an error raised at collection is lost on an xdist worker): it would make the fixture again."""
    if problems := item.stash.get(MISPLACED, []):
        pytest.fail("\n".join(problems), pytrace=False)


# optionalhook: the hook is pytest-xdist's, and `-p no:xdist` runs have no such hook.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `--dist loadgroup`, a scheduler that reads each test's group from its path: xdist's
    own finds none with pytest 9.2 (pytest-xdist issue #1386; drop this once a released
    pytest-xdist handles pytest 9.2). Other dist modes keep xdist's scheduler."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return PathGroupScheduling(config, log)


def pytest_report_header() -> str:
    """Which botocore this run's clients use (`make test-other-botocore`: another version)."""
    import boto3
    import botocore

    return f"messenger: boto3 {boto3.__version__}, botocore {botocore.__version__}"


@pytest.fixture(scope="session")
def local_endpoint() -> Iterator[LocalProcess]:
    """The moto server (`messenger local`: SQS with messenger's index, cost per request flat in
    queue depth), started once per session; AWS_ENDPOINT_URL points at it."""
    server = start_local_process()
    os.environ["AWS_ENDPOINT_URL"] = server.url
    yield server
    server.stop()
    os.environ.pop("AWS_ENDPOINT_URL", None)


@pytest.fixture
def endpoint(local_endpoint: LocalProcess) -> Iterator[str]:
    """A clean moto server for one test: every resource of earlier tests is gone."""
    reset(local_endpoint.url)
    BaseProducer.reset_instances()
    yield local_endpoint.url
    BaseProducer.reset_instances()


@pytest.fixture
def settings(endpoint: str) -> Settings:
    """Settings with a namespace of this test's own and a short retry budget."""
    return Settings.from_env(namespace=f"t{uuid.uuid4().hex[:8]}", retry_budget_seconds=5.0)


@pytest.fixture
def clients(endpoint: str) -> ClientFactory:
    return ClientFactory("us-east-1")


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Headless Chromium driven by Selenium, started once per session (tests/dashboard.py);
    skips with one line where none is installed, fails instead with MESSENGER_REQUIRE_BROWSER=1."""
    from tests.dashboard import REQUIRE_VARIABLE, BrowserUnavailable, start_chromium

    try:
        driver = start_chromium()
    except BrowserUnavailable as error:
        if os.environ.get(REQUIRE_VARIABLE) == "1":
            pytest.fail(f"{error} ({REQUIRE_VARIABLE}=1)")
        pytest.skip(str(error))
    yield driver
    driver.quit()
