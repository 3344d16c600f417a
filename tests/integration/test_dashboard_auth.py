"""The deployed dashboard's key handling and identities (issue 49's missing test, issue 50 items
10 and 13): a key id that is not exactly a UUID-like name never reaches the key endpoint (a
trailing newline included); a key id the endpoint could not give is remembered (25 refused
requests, even at once against a slow endpoint, make one fetch; after the TTL, on a controlled
clock, one more); the memory is bounded; an unverified e-mail is marked and `sub` is kept."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.dashboard import ALB_ARN, CLIENT_ID, alb_key_server, served

pytest.importorskip("jwt", reason="the dashboard extra is not installed")

from messenger.tools.dashboard.auth import AlbIdentity, Unauthenticated  # noqa: E402

OPERATOR = {"sub": "u-1", "email": "ada@example.com", "custom:groups": "ops"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def signer():
    with alb_key_server() as keys:
        yield keys


def identity_of(signer, **kwargs) -> AlbIdentity:
    return AlbIdentity("eu-west-1", ALB_ARN, CLIENT_ID, frozenset({"ops"}),
                       groups_claim="custom:groups", key_url=signer.key_url, **kwargs)


def test_a_key_id_with_a_trailing_newline_or_a_path_is_refused_without_a_fetch(signer):
    identity = identity_of(signer)
    for kid in (signer.kid + "\n", "../../evil", signer.kid + "/x", "a" * 129, "é"):
        with pytest.raises(Unauthenticated, match="without a valid key id"):
            identity.verify(signer.token(OPERATOR, kid=kid))
    assert signer.fetched == []
    # The good kid is fetched once, then kept
    for _ in range(3):
        assert identity.verify(signer.token(OPERATOR)).subject == "u-1"
    assert signer.fetched == [f"/{signer.kid}"]


def test_25_refused_requests_naming_an_unknown_key_make_one_fetch(settings, clients, signer):
    clock = Clock()
    identity = identity_of(signer, clock=clock, missing_key_ttl=300)
    unknown = signer.token(OPERATOR, kid="0000-1111")
    with served(settings, clients, identity=identity) as dash:
        # While the key endpoint is slow (holds its answer), 25 requests arrive at once
        signer.answering.clear()
        with ThreadPoolExecutor(25) as pool:
            answers = [pool.submit(requests.get, dash.url + "/", timeout=60,
                                   headers={"x-amzn-oidc-data": unknown}) for _ in range(25)]
            asked = threading.Event()
            for _ in range(6000):  # the first fetch reaches the held endpoint (up to 60 s)
                if signer.fetched or asked.wait(0.01):
                    break
            signer.answering.set()
            statuses = [a.result().status_code for a in answers]
        assert statuses == [401] * 25
        assert signer.fetched == ["/0000-1111"]
        # Then 25 more, one after another: refused from memory
        for _ in range(25):
            assert requests.get(dash.url + "/", headers={"x-amzn-oidc-data": unknown},
                                timeout=30).status_code == 401
        assert signer.fetched == ["/0000-1111"]
        # The good key still works, fetched once
        assert requests.get(dash.url + "/", headers={"x-amzn-oidc-data": signer.token(
            OPERATOR)}, timeout=30).status_code == 200
        assert signer.fetched == ["/0000-1111", f"/{signer.kid}"]
        # After the TTL the unknown key is asked once more (a key the ALB rotated in is found)
        clock.now += 301
        for _ in range(3):
            assert requests.get(dash.url + "/", headers={"x-amzn-oidc-data": unknown},
                                timeout=30).status_code == 401
        assert signer.fetched == ["/0000-1111", f"/{signer.kid}", "/0000-1111"]


def test_the_memory_of_unknown_keys_is_bounded(signer):
    identity = identity_of(signer, missing_keys_max=3)
    for n in range(5):
        with pytest.raises(Unauthenticated, match="could not be read"):
            identity.verify(signer.token(OPERATOR, kid=f"kid-{n}"))
    assert len(signer.fetched) == 5
    # The three newest are remembered, the oldest was forgotten (fetched again)
    for n in (4, 3, 2, 0):
        with pytest.raises(Unauthenticated):
            identity.verify(signer.token(OPERATOR, kid=f"kid-{n}"))
    assert signer.fetched[5:] == ["/kid-0"]


@pytest.mark.parametrize(("verified", "name", "flag"), [
    (False, "ada@example.com (unverified)", False),
    ("false", "ada@example.com (unverified)", False),
    (True, "ada@example.com", True),
    ("true", "ada@example.com", True),
    (None, "ada@example.com", None),
])
def test_an_unverified_email_is_marked_and_sub_is_kept(signer, verified, name, flag):
    claims = {**OPERATOR, **({} if verified is None else {"email_verified": verified})}
    user = identity_of(signer).verify(signer.token(claims))
    assert (user.name, user.subject, user.email, user.email_verified) == (
        name, "u-1", "ada@example.com", flag)
