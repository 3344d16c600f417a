"""Shared fixtures: one moto server (a child process on a free loopback port) per session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from messenger.aws import ClientFactory
from messenger.produce.producer import _BaseProducer
from messenger.settings import Settings
from messenger.tools.local import LOCAL_CREDENTIALS, LocalProcess, reset, start_local_process

# Never reach real AWS from a test, whatever the developer's shell has.
for _name in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
    os.environ.pop(_name, None)
os.environ.update(LOCAL_CREDENTIALS)


# `make test` runs the suite on several pytest-xdist workers (`--dist loadgroup`): the suite waits
# on processes, queues and timers far more than it computes, so workers overlap the waits. Tests
# that share an expensive once-per-session fixture run on one worker, so it is made once:
# the CDK synths (every tests/infra file), Chromium, the podman image, the Spark sessions and the
# module-scoped moto fixtures. Every other test goes to whichever worker is free; each worker has
# its own moto server (`local_endpoint`).
XDIST_GROUPS = {
    "tests/infra/": "cdk-synth",
    "tests/integration/test_consumer_container.py": "podman",
    "tests/integration/test_consumer_image.py": "podman",
    "tests/integration/test_spark.py": "spark",
    "tests/integration/test_emr_spark.py": "spark",
    "tests/integration/test_moto_sqs.py": "moto-sqs",
    "tests/integration/test_moto_tagging.py": "moto-tagging",
}
XDIST_FIXTURE_GROUPS = {"browser": "browser"}


# tryfirst: pytest-xdist's worker reads the xdist_group marks in its own
# pytest_collection_modifyitems (it appends `@group` to each node id, which `--dist loadgroup`
# schedules by); it is registered after this conftest, so without tryfirst it runs first, sees
# no marks, and every test is scheduled on its own. NB: with pytest 9.2 and pytest-xdist 3.8 the
# suffix is lost anyway (xdist writes `item._nodeid`, which pytest 9.2's node ids no longer
# read: pytest-xdist issue 1386), so until one of them changes the groups are not kept together.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        path = Path(str(item.path)).relative_to(root).as_posix()
        group = next((name for prefix, name in XDIST_GROUPS.items() if path.startswith(prefix)),
                     None)
        group = group or next(
            (name for fixture, name in XDIST_FIXTURE_GROUPS.items()
             if fixture in item.fixturenames),
            None,
        )
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


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
    _BaseProducer.reset_instances()
    yield local_endpoint.url
    _BaseProducer.reset_instances()


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
