"""The fast botocore paths switch on only for the verified botocore, or when told; else clients
are plain botocore and nothing of the fast paths is on their call path."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import botocore
import botocore.validate
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSHTTPConnectionPool, AWSHTTPSConnectionPool
from botocore.parsers import ResponseParserFactory
from botocore.serialize import JSONSerializer
from botocore.useragent import UserAgentString

from messenger import fastboto
from messenger.aws import ClientFactory
from messenger.errors import InvalidSettings
from messenger.fastboto import ENV_VAR, VERIFIED_BOTOCORE, FastPaths
from tests.unit.test_signing import answering

ROOT = Path(__file__).resolve().parents[2]
UNVERIFIED = "1.44.999"


@pytest.fixture
def fresh(monkeypatch):
    """Credentials in the environment, no switch set, and the decision not yet logged."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(fastboto, "_told", set())
    return monkeypatch


def what_clients_take(factory: ClientFactory) -> dict[str, Any]:
    """What a factory's clients sign with, parse and serialize with, how they build their
    User-Agent and what an SNS body is when it is signed, from one call of each (no request
    goes out: `before-send` answers)."""
    signers: list[type[Any]] = []
    bodies: list[Any] = []
    found: dict[str, Any] = {}
    for service, validate in (("sqs", True), ("sqs", False), ("sns", False)):
        client = factory.client(service, validate_params=validate)
        chooser = client._request_signer.get_auth_instance

        def spy(*args: Any, chooser: Any = chooser, **kwargs: Any) -> Any:
            auth = chooser(*args, **kwargs)
            signers.append(type(auth))
            return auth

        client._request_signer.get_auth_instance = spy
        if service == "sqs":
            client.meta.events.register("before-send", answering(b'{"Messages": []}'))
            client.receive_message(QueueUrl="https://sqs.us-east-1.amazonaws.com/1/q")
            found[f"serializer, validate={validate}"] = type(client._serializer)
        else:
            client.meta.events.register(
                "before-sign", lambda request=None, **_: bodies.append(request.data))
            client.meta.events.register("before-send", answering(
                b"<PublishResponse><PublishResult><MessageId>1</MessageId></PublishResult>"
                b"</PublishResponse>"))
            client.publish(TopicArn="arn:aws:sns:us-east-1:1:t", Message="café")
        found[f"{service} parser factory"] = type(client._endpoint._response_parser_factory)
        found[f"{service} connection pools"] = dict(
            client._endpoint.http_session._pool_classes_by_scheme)
        found[f"{service} user agent"] = getattr(client._user_agent_creator.to_string,
                                                 "__func__", None)
    found["signers"] = set(signers)
    found["sns body when signed"] = type(bodies[0])
    return found


PLAIN_BOTOCORE = {
    "serializer, validate=True": botocore.validate.ParamValidationDecorator,
    "serializer, validate=False": JSONSerializer,
    "sqs parser factory": ResponseParserFactory,
    "sns parser factory": ResponseParserFactory,
    "sqs user agent": UserAgentString.to_string,
    "sns user agent": UserAgentString.to_string,
    "signers": {SigV4Auth},
    "sns body when signed": dict,
    "sqs connection pools": {"http": AWSHTTPConnectionPool, "https": AWSHTTPSConnectionPool},
    "sns connection pools": {"http": AWSHTTPConnectionPool, "https": AWSHTTPSConnectionPool},
}


@pytest.mark.parametrize("switch,version", [("0", VERIFIED_BOTOCORE), (None, UNVERIFIED),
                                            ("", UNVERIFIED), ("0", UNVERIFIED)])
def test_off_or_unverified_the_clients_are_plain_botocore(fresh, switch, version):
    # Given the switch off, or an other botocore than the verified one
    if switch is not None:
        fresh.setenv(ENV_VAR, switch)
    fresh.setattr(botocore, "__version__", version)
    factory = ClientFactory("us-east-1", endpoint_url="https://sqs.us-east-1.amazonaws.com")
    # Then its clients sign, serialize, parse and build their User-Agent as botocore does
    assert factory.fast_paths.on is False
    assert what_clients_take(factory) == PLAIN_BOTOCORE


@pytest.mark.parametrize("switch,version", [(None, VERIFIED_BOTOCORE), ("1", VERIFIED_BOTOCORE),
                                            ("1", UNVERIFIED)])
def test_on_for_the_verified_botocore_or_when_told(fresh, switch, version):
    from messenger.fastboto.headers import FastHTTPConnectionPool, FastHTTPSConnectionPool
    from messenger.fastboto.responses import FastParserFactory
    from messenger.fastboto.serialize import PlannedJsonSerializer
    from messenger.fastboto.signing import FastSigV4Auth

    if switch is not None:
        fresh.setenv(ENV_VAR, switch)
    fresh.setattr(botocore, "__version__", version)
    factory = ClientFactory("us-east-1", endpoint_url="https://sqs.us-east-1.amazonaws.com")
    assert factory.fast_paths.on is True
    found = what_clients_take(factory)
    assert found["signers"] == {FastSigV4Auth}
    assert found["serializer, validate=False"] is PlannedJsonSerializer
    assert found["serializer, validate=True"] is botocore.validate.ParamValidationDecorator
    assert found["sqs parser factory"] is FastParserFactory
    assert found["sqs user agent"] is None  # the client's own, kept per feature set
    assert found["sns body when signed"] is str  # encoded once, before signing
    assert found["sqs connection pools"] == found["sns connection pools"] == {
        "http": FastHTTPConnectionPool, "https": FastHTTPSConnectionPool}


def test_a_plain_process_never_imports_the_fast_paths():
    # Given a fresh interpreter with the switch off, making clients of every kind
    script = (
        "import json, sys\nfrom messenger.aws import ClientFactory\n"
        "factory = ClientFactory('us-east-1')\n"
        "for service in ('sqs', 'sns', 's3'):\n"
        "    factory.client(service)\n    factory.client(service, validate_params=False)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('messenger.fastboto'))))"
    )
    env = {**os.environ, ENV_VAR: "0", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    # Then only the switch itself was imported, none of the modules reaching into botocore
    assert json.loads(done.stdout.splitlines()[-1]) == ["messenger.fastboto"]


@pytest.mark.parametrize("value", ["yes", "true", "2", "off", "01"])
def test_another_value_is_refused_naming_the_variable_and_its_values(fresh, value):
    fresh.setenv(ENV_VAR, value)
    with pytest.raises(InvalidSettings) as raised:
        ClientFactory("us-east-1")
    message = str(raised.value)
    assert message.startswith(f"{ENV_VAR} must be 0 ") and "or 1 " in message
    assert repr(value) in message


def test_the_command_line_exits_2_with_one_line_on_a_bad_value():
    env = {**os.environ, ENV_VAR: "yes", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    done = subprocess.run([sys.executable, "-m", "messenger", "status", "some-id"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"messenger: {ENV_VAR} must be 0 (plain botocore) or 1 (the fast paths with any "
        f"botocore), or unset (the fast paths with botocore {VERIFIED_BOTOCORE} only), "
        f"got 'yes'"]


def test_one_line_says_why_once_per_process(fresh, caplog):
    caplog.set_level(logging.DEBUG, logger="messenger.fastboto")
    fresh.setattr(botocore, "__version__", UNVERIFIED)
    for _ in range(3):
        ClientFactory("us-east-1")
    lines = [(r.levelname, r.getMessage()) for r in caplog.records
             if r.name == "messenger.fastboto"]
    assert lines == [("INFO", f"fast botocore paths off: botocore {UNVERIFIED} is installed, they "
                              f"were verified against {VERIFIED_BOTOCORE} only "
                              f"({ENV_VAR}=1 forces them on)")]
    # forced on for an unverified botocore: a warning; off by the switch: an INFO line
    fresh.setenv(ENV_VAR, "1")
    assert FastPaths.from_env().on is True
    fresh.setenv(ENV_VAR, "0")
    assert FastPaths.from_env().on is False
    assert [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "messenger.fastboto"][1:] == [
        ("WARNING", f"fast botocore paths on: {ENV_VAR}=1, with botocore {UNVERIFIED} "
                    f"(verified against {VERIFIED_BOTOCORE} only)"),
        ("INFO", f"fast botocore paths off: {ENV_VAR}=0"),
    ]


def test_requirements_pin_the_verified_botocore():
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)",
                           (ROOT / "requirements.txt").read_text(), re.M))
    assert pins.get("botocore") == VERIFIED_BOTOCORE
    # the consumer image installs with that pin as a constraint
    assert "boto3|botocore|filelock" in (ROOT / "consumer_image" / "Dockerfile").read_text()
