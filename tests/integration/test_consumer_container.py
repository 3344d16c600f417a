"""The consumer image built and run as ECS runs it: podman builds consumer_image/Dockerfile
unchanged from the context `cdk deploy` stages (a team's own code folder: consumer_apps/), and
the container runs with the host's network against the session's moto server.

What would otherwise first show up as a failed deployment: a broken COPY, a console script not on
PATH, a HEALTHCHECK lost in the image format, a consumer that is not PID 1 or ignores SIGTERM.
Skipped with one line when no engine can be set up here (not root, not Debian); CI sets it up
(.ci/run) and sets MESSENGER_REQUIRE_PODMAN=1, so there a missing engine fails instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from messenger import Producer, Settings
from messenger.aws import ClientFactory
from messenger.channel import physical_name
from messenger.provision import Provisioner
from messenger.tools.local import LOCAL_CREDENTIALS
from tests.integration.consumer_apps.apps import SleepyConsumer
from tests.podman import (
    REQUIRE_VARIABLE,
    Container,
    Engine,
    EngineUnavailable,
    build_image,
    engine_problem,
    local_engine,
)

pytestmark = [pytest.mark.container, pytest.mark.slow]
_PROBLEM = engine_problem()
if _PROBLEM is not None and os.environ.get(REQUIRE_VARIABLE) != "1":
    # One line for the module (where CI requires the engine, the fixture fails instead)
    pytest.skip(f"no podman engine: {_PROBLEM}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
APP_DIR = ROOT / "tests" / "integration" / "consumer_apps"  # the image's /app/consumer_apps
APPS = "consumer_apps.apps"
CHANNEL = "consumer_test"  # the channel of every consumer in APPS
# A tag of this checkout's own: other checkouts share the engine's storage. Kept after the
# session (removing it would drop podman's layer cache: the next build would take 15 s, not 4 s).
TAG = f"localhost/messenger-consumer:test-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"
RECORD_DIR = "/record"  # where the container's handlers append their records


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """The podman engine with the consumer image built (once per session)."""
    try:
        found = local_engine()
        build_image(APP_DIR, TAG, tmp_path_factory.mktemp("consumer-image") / "build.log")
    except EngineUnavailable as why:
        if os.environ.get(REQUIRE_VARIABLE) == "1":
            pytest.fail(f"{REQUIRE_VARIABLE}=1 but no podman engine: {why}")
        pytest.skip(f"no podman engine: {why}")
    return found


@pytest.fixture
def run_consumer(
    engine: Engine, settings: Settings, endpoint: str, clients: ClientFactory, tmp_path: Path
) -> Iterator[Callable[..., Container]]:
    """Start `consumer_apps.apps:<app>` in a container, as an ECS task would; removed after."""
    started: list[Container] = []
    records = tmp_path / "record"
    records.mkdir()
    records.chmod(0o777)  # the container's user 10001 appends to it
    # The channel exists before the task starts (`cdk deploy`); the task only verifies it.
    Provisioner(clients, settings).ensure_channel(SleepyConsumer.channel_spec(settings.namespace))

    def run(app: str, **extra_env: str) -> Container:
        env = {
            **settings.as_env(), **LOCAL_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint,
            # What stacks/consumer_service.py gives the task (a shutdown timeout below the
            # stop timeout of `podman stop --time 10`, as the service's validation demands)
            "MESSENGER_PROVISIONING": "verify", "MESSENGER_SHUTDOWN_TIMEOUT": "8",
            "MESSENGER_CONCURRENCY": "1", "AWS_REGION": settings.region,
            "CONSUMER_TEST_RECORD": f"{RECORD_DIR}/record.jsonl",
            **extra_env,
        }
        container = Container(engine)
        started.append(container)
        # The command an ECS task definition gives (stacks/consumer_service.py).
        return container.start(
            TAG, ["messenger", "consume", f"{APPS}:{app}"], env,
            volumes=[f"{records}:{RECORD_DIR}"],
        )

    yield run
    for container in started:
        container.remove()


def handler_records(tmp_path: Path) -> list[dict]:
    path = tmp_path / "record" / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def producer(settings: Settings) -> Producer:
    class TestProducer(Producer):
        channel = CHANNEL

    return TestProducer(settings=settings)


def messages_held(clients: ClientFactory, settings: Settings) -> int:
    """Messages in the channel's queue, visible or not."""
    sqs = clients.client("sqs")
    url = sqs.get_queue_url(QueueName=physical_name(CHANNEL, settings.namespace))["QueueUrl"]
    attributes = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def wait_until_empty(clients: ClientFactory, settings: Settings, timeout: float = 10.0) -> None:
    """Deletes go out in batches after a short linger: wait for the queue to empty."""
    deadline = time.monotonic() + timeout
    while (held := messages_held(clients, settings)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert held == 0, f"{held} message(s) still in the queue after {timeout} s"


def shell(engine: Engine, script: str) -> str:
    """Run `sh -c script` in a throwaway container of the image; its stdout."""
    result = engine.run("run", "--rm", "--network", "none", "--entrypoint", "sh", TAG, "-c", script)
    return result.stdout


def test_the_image_config_keeps_health_check_user_entrypoint_and_stop_signal(engine):
    [image] = json.loads(engine.run("image", "inspect", TAG).stdout)
    config = image["Config"]
    # The OCI format drops HEALTHCHECK; the Docker format (what ECR and ECS read) keeps it
    assert image["ManifestType"] == "application/vnd.docker.distribution.manifest.v2+json"
    health = image["Healthcheck"]
    assert health["Test"] == ["CMD", "check_consumer_health"]
    assert (health["Interval"], health["Timeout"], health["Retries"]) == (30e9, 10e9, 3)
    assert config["User"] == "10001"
    assert config["Entrypoint"] == ["consumer-entrypoint"]
    assert config["StopSignal"] == "SIGTERM"
    assert "PYTHONPATH=/app" in config["Env"]
    assert image["Architecture"] == "amd64"


def test_console_scripts_are_on_path_and_an_ecs_command_runs_through_the_entrypoint(engine):
    found = shell(engine, "for name in messenger check_consumer_health consumer-entrypoint; "
                          "do command -v $name; done")
    assert found.split() == [
        "/usr/local/bin/messenger", "/usr/local/bin/check_consumer_health",
        "/usr/local/bin/consumer-entrypoint",
    ]
    # The whole `messenger consume ...` command, as the task definition passes it
    result = engine.run("run", "--rm", "--network", "none", TAG, "messenger", "consume", "--help")
    assert "package.module:ClassName" in result.stdout


def test_the_image_holds_the_library_and_the_service_code_only(engine):
    listing = shell(engine, """
        echo "app: $(ls -A /app | tr '\\n' ' ')"
        echo "service: $(ls -A /app/consumer_apps | tr '\\n' ' ')"
        echo "build: $(ls -d /build 2>/dev/null)"
        junk=$(find / -xdev \\( -name .venv -o -name cdk.out -o -name node_modules \
            -o -name .git -o -name __pycache__ -path '/app/*' \\) -print 2>/dev/null)
        echo "junk: $(echo $junk)"
        echo "library: $(python -c 'import messenger; print(messenger.__file__)')"
        echo "packages: $(pip list --format json)"
    """)
    lines = dict(line.split(": ", 1) for line in listing.splitlines() if ": " in line)
    # /app holds the service's folder, as in the repository minus caches; the build dir is gone
    assert lines["app"].split() == ["consumer_apps"]
    expected = sorted(p.name for p in APP_DIR.iterdir() if p.name != "__pycache__")
    assert sorted(lines["service"].split()) == expected
    assert lines["build"].strip() == ""
    assert lines["junk"].strip() == ""
    assert lines["library"] == "/usr/local/lib/python3.11/site-packages/messenger/__init__.py"
    versions = {p["name"].lower(): p["version"] for p in json.loads(lines["packages"])}
    installed = set(versions)
    assert {"messenger", "boto3", "filelock", "rich"} <= installed
    # botocore is the one requirements.txt pins (the image's constraints come from it)
    pins = dict(line.split("==", 1) for line in
                (Path(__file__).resolve().parents[2] / "requirements.txt").read_text().split()
                if "==" in line)
    assert versions["botocore"] == pins["botocore"]
    # The service's own requirements.txt is installed too
    assert "slack_sdk" in installed or "slack-sdk" in installed
    # Nothing the tests, the CDK app or the tools need: they would only grow the image
    assert not installed & {"pytest", "moto", "aws-cdk-lib", "ruff", "mypy", "pyspark"}


@pytest.mark.timeout(120)
def test_a_consumer_in_the_container_processes_a_message_pushed_from_the_host(
    run_consumer, producer, clients, settings, tmp_path
):
    # Given the consumer running in its container, LISTENING
    container = run_consumer("SleepyConsumer")
    container.wait_for_state("LISTENING")
    # Then it is PID 1 (the entrypoint exec'd it), as the unprivileged user
    status = container.exec("cat", "/proc/1/status").stdout
    uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
    assert uid_line.split()[1:] == ["10001"] * 4
    cmdline = container.exec("cat", "/proc/1/cmdline").stdout.split("\0")
    assert cmdline[-3:-1] == ["consume", f"{APPS}:SleepyConsumer"]
    # And the image's health check passes
    health = container.health_check()
    assert (health.exit_code, health.check_exit_code) == (0, 0), health
    # When the host pushes a message
    producer.push({"sleep": 0})
    completed = container.wait_for_event("completed")
    # Then the handler ran in the container's PID 1 and the message is deleted
    assert [(r["event"], r["body"], r["pid"]) for r in handler_records(tmp_path)] == [
        ("start", {"sleep": 0}, 1), ("end", {"sleep": 0}, 1),
    ]
    assert completed["channel"].endswith(CHANNEL)
    wait_until_empty(clients, settings)


@pytest.mark.timeout(120)
def test_the_health_check_fails_on_a_corrupt_health_file(run_consumer, engine):
    # (refreshed every 60 s: the consumer's next rewrite, which repairs the file, comes later)
    container = run_consumer("SleepyConsumer", MESSENGER_HEALTH_REFRESH_SECONDS="60")
    container.wait_for_state("LISTENING")
    assert container.health_check().exit_code == 0
    # When the health file is torn (a consumer that died mid-write, a full disk)
    written = container.exec("sh", "-c", "printf '{\"state\": ' > /tmp/messenger-health.json")
    assert written.returncode == 0, written.stderr
    # Then the image's health check fails (ECS counts it towards the 3 retries), naming the file
    health = container.health_check()
    assert (health.exit_code, health.verdict, health.check_exit_code) == (1, "unhealthy", 1)
    assert "health file /tmp/messenger-health.json is malformed" in health.check_output


@pytest.mark.timeout(120)
def test_the_health_check_fails_when_the_handler_is_stuck(run_consumer, producer, engine):
    # Given a consumer whose handler blocks past processing_timeout (2 s) + grace (1 s)
    container = run_consumer("StuckConsumer", MESSENGER_HEALTH_GRACE="1")
    container.wait_for_state("LISTENING")
    assert container.health_check().exit_code == 0
    producer.push({"blocked": True})
    container.wait_for_event("timed_out")
    time.sleep(1.5)
    # Then the health check fails: ECS would replace the task
    health = container.health_check()
    assert (health.exit_code, health.verdict, health.check_exit_code) == (1, "unhealthy", 1)
    assert "stuck in PROCESSING" in health.check_output


@pytest.mark.timeout(120)
def test_stop_sends_sigterm_to_pid_1_which_finishes_the_in_flight_handler_and_exits_0(
    run_consumer, producer, clients, settings, engine, tmp_path
):
    # Given a consumer in the middle of a 3 s handler
    container = run_consumer("SleepyConsumer")
    container.wait_for_state("LISTENING")
    producer.push({"sleep": 3})
    container.wait_for_event("started")
    # When the task is stopped as ECS stops it: SIGTERM, SIGKILL after the stop timeout
    stopped_at = time.monotonic()
    engine.run("stop", "--time", "10", container.name, timeout=60)
    took = time.monotonic() - stopped_at
    # Then PID 1 handled SIGTERM: the handler finished, the message is deleted, exit code 0
    # (a SIGKILL after the 10 s would read 137)
    state = engine.inspect(container.name)["State"]
    assert state["ExitCode"] == 0, f"exit {state['ExitCode']} after {took:.1f} s"
    assert [r["event"] for r in handler_records(tmp_path)] == ["start", "end"]
    events = container.events()
    assert "completed" in [e.get("event") for e in events]
    states = [e["state"] for e in events if e.get("event") == "state"]
    assert states[-2:] == ["EXITING", "EXITED"]
    assert messages_held(clients, settings) == 0
