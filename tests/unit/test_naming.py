"""Namespaces and platform names: two namespaces share a resource only when they are equal."""

from __future__ import annotations

import re

import pytest

from messenger.channel import (
    MAX_NAMESPACE_LENGTH,
    ChannelSpec,
    offload_bucket_name,
    validate_namespace,
)
from messenger.errors import InvalidChannelSpec, InvalidSettings
from messenger.settings import Settings

#: S3's rules for general purpose bucket names.
S3_BUCKET = re.compile(
    r"^(?!xn--|sthree-|amzn-s3-demo-)[a-z0-9](?!.*\.\.)[a-z0-9.-]{1,61}[a-z0-9]$"
)


@pytest.mark.parametrize(
    ("namespace", "suggestion"),
    [
        ("Prod", "'prod'"),        # would share 'prod-messenger-offload-...' with 'prod'
        ("a_b", "'a-b'"),          # would share a bucket with 'a-b'
        ("a--b", "'a-b'"),
        ("stage-", "'stage'"),
        ("1st", None),             # stack names start with a letter
        ("x" * (MAX_NAMESPACE_LENGTH + 1), None),
        ("pro d", "'pro-d'"),
    ],
)
def test_namespaces_that_could_collide_are_refused_with_a_suggestion(namespace, suggestion):
    with pytest.raises(InvalidChannelSpec) as refused:
        validate_namespace(namespace)
    message = str(refused.value)
    assert f"namespace {namespace!r} may contain only lowercase letters" in message
    assert "would share one bucket" in message
    if suggestion:
        assert f"e.g. {suggestion}" in message


def test_reserved_bucket_prefixes_are_refused():
    with pytest.raises(InvalidChannelSpec, match="S3 bucket names may not start with"):
        validate_namespace("sthree")


@pytest.mark.parametrize("namespace", ["", "prod", "a-b", "team1", "x" * MAX_NAMESPACE_LENGTH])
def test_valid_namespaces_make_valid_distinct_bucket_names(namespace):
    assert validate_namespace(namespace) == namespace
    # The longest region name today has 14 characters
    for region in ("eu-west-1", "ap-southeast-5"):
        name = offload_bucket_name(namespace, "123456789012", region)
        assert S3_BUCKET.match(name) and len(name) <= 63, name
    assert offload_bucket_name(namespace, "123456789012", "eu-west-1") != offload_bucket_name(
        namespace, "123456789012", "us-east-1"
    )


def test_the_runtime_and_the_specs_refuse_the_same_namespaces():
    with pytest.raises(InvalidSettings, match="MESSENGER_NAMESPACE: namespace 'Prod'"):
        Settings.from_env({"MESSENGER_NAMESPACE": "Prod"})
    with pytest.raises(InvalidChannelSpec, match="namespace 'a_b'"):
        ChannelSpec("orders", namespace="a_b")
    settings = Settings.from_env({"MESSENGER_NAMESPACE": "prod", "AWS_REGION": "eu-west-1"})
    assert settings.bucket_name("123456789012") == "prod-messenger-offload-123456789012-eu-west-1"
