"""The botocore code messenger.fastboto relies on is the code it was verified against.

The fast paths replace or call private botocore functions (the list is in
`messenger/fastboto/__init__.py`'s docstring). Each one's source is pinned here by its SHA-1, as
aiobotocore's tests/test_patches.py does for its own patches: a botocore upgrade that changes,
renames or removes one fails this test naming it. Re-verifying for a new botocore
(docs/fast-botocore.md): read each named function's diff, adapt the fast path and its
side-by-side tests if need be, then print the new pins with

    .venv/bin/python -m tests.unit.test_fastboto_pins

and paste them here, with the new VERIFIED_BOTOCORE and requirements.txt pin.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import re
from typing import Any

import botocore.auth
import pytest

from messenger import fastboto

#: SHA-1 of the source (a value: of its repr) of each botocore name the fast paths rely on,
#: botocore 1.44.5.
PINS = {
    # signing: FastSigV4Auth replaces three methods, the rest read their results or are called
    "botocore.auth.SigV4Auth.headers_to_sign": "b748d11abda1ff2b3c07992b9893bb60df182f75",
    "botocore.auth.SigV4Auth.payload": "a723b3443e3cfb0d63687e16c1fdb39b5027bfc1",
    "botocore.auth.SigV4Auth.signature": "542b6beab215a6d0f3485231394e0bd05da50a85",
    "botocore.auth.SigV4Auth.__init__": "682df85002bb6f696bb7ba30a5b4dc1ece5077fd",
    "botocore.auth.SigV4Auth.add_auth": "3dc848e82087529461087e1a1b09a4a7e61c7aa7",
    "botocore.auth.SigV4Auth.canonical_headers": "d6880496840e75e7a60b8eeca39398104bac55f3",
    "botocore.auth.SigV4Auth.signed_headers": "363803ff99d129cfdf68079a281280eefea5c3da",
    "botocore.auth.SigV4Auth._is_streaming_checksum_payload":
        "b27029b9afed7d7fd52734805b6d207b33441bc6",
    "botocore.auth.SigV4Auth._should_sha256_sign_payload":
        "9c100090c068b85a0c1eaa7009dd7eb74d147298",
    "botocore.auth._host_from_url": "80f1f4aa5f49fd3f488298ce8265a212b9d826f6",
    "botocore.auth.SIGNED_HEADERS_BLACKLIST": "e6172516feee4d9f8526aa9f4a8cd4613cdc2955",
    "botocore.signers.RequestSigner.get_auth_instance": "13e90d57d536179621ac012ace97e4c2cbaa096e",
    "botocore.signers.RequestSigner.sign": "deb7af66bc099801810eee5b00db83da2563d0a3",
    "botocore.awsrequest.AWSRequestPreparer._prepare_body":
        "aaf3c7aa5d75e5a555e535c61941410e908a3182",
    # responses: the JSON parser's walk, which a plan reproduces
    "botocore.parsers.JSONParser": "9fd478751cd0c5b039180d477446083d6db36500",
    "botocore.parsers.BaseJSONParser": "324b611fca5a0507f6f05db54de546cba23e3bb5",
    "botocore.parsers.ResponseParser._parse_shape": "cca7d28735556790553c8f5be68d47ab55eb1ad8",
    "botocore.parsers.ResponseParser._handle_list": "1f977f8725b8b897f8a4e47a346e23198dbdd45f",
    "botocore.parsers.ResponseParser._default_handle": "c6939413325f4eea7efd7175cf5b2e813cdd6a08",
    "botocore.parsers.ResponseParserFactory": "fa73fd61e279ed7df6465453c37f656e9a8c4069",
    "botocore.session.Session.create_client": "90e312aa984ee5b6b3cf5493820f0d8133846b6d",
    # serialize: the JSON serializer's walk, which a planned body skips
    "botocore.serialize.JSONSerializer": "73a743077548b7784669027a6ccce7e79d1ed037",
    "botocore.serialize.Serializer.__init__": "d7d7e6a1b0bc825fe08607857071461280791e3b",
    # the client attributes replaced, and where botocore reads them
    "botocore.client.BaseClient.__init__": "2a4919bd9e452610fa52e8e765e3ab6bb915f20b",
    "botocore.client.BaseClient._convert_to_request_dict":
        "5e0a374926b6ee1a8715963ab551e126506e7fc9",
    # user agent
    "botocore.useragent.UserAgentString.to_string": "9eba9b66963d3756b57504fb29b71bed1ce1496e",
    "botocore.useragent.UserAgentString._build_feature_metadata":
        "2bdc9c9c46b35523eb2f4252fceb93f5bd5df59d",
    "botocore.useragent.UserAgentString.rebuild_and_replace_user_agent_handler":
        "4a60c398517a3024ef9edf10823a8f6805653a6d",
    "botocore.context.get_context": "7e08efb7ab1f255348ae8317904ee1041331bf0f",
    "botocore.context.ClientContext": "a70e47a514bb79086b82c57bbec60a9216f4da0b",
    # headers: the per-client pool classes replaced, the connection keeping its response class
    "botocore.httpsession.URLLib3Session.__init__": "414a4829d430670d868e62bcf69bf274bd514b82",
    "botocore.endpoint.Endpoint.__init__": "4bafe9733a02817950f5096612410ec4ebc40f55",
    "botocore.awsrequest.AWSConnection": "e02ce888e3faae8abac744e7951edaa4caa0b3d9",
    "botocore.awsrequest.AWSHTTPConnectionPool": "e65e149b3c06b924ea91991f2d5f282bf383e52f",
    "botocore.awsrequest.AWSHTTPSConnectionPool": "bc3d234d88f7a0d8cd2b6df5d845dd8ba769dc29",
    # retries: the standard-mode handler wrapped, where it is registered and how it is consulted
    "botocore.retries.standard.register_retry_handler": "e99b0b760b387d6131d6a26f2cb0613a2d692051",
    "botocore.retries.standard.RetryHandler": "9ae70f2ac08ad381e7c40f0eae5c0a7fe336fd51",
    "botocore.client.ClientCreator._register_v2_standard_retries":
        "9ec4ff68599544b4f46067b3783287862d38fb50",
    "botocore.endpoint.Endpoint._needs_retry": "ae59155b57c0a743fd00b537449d4b6ad2ee997c",
    "botocore.endpoint.Endpoint._send_request": "0158d0b6c492fde95947b49c34fd0927e5d145a1",
    "botocore.hooks.HierarchicalEmitter": "34b0bedc913eb5bd9e4ccfd368db375bebe3c972",
    "botocore.hooks.EventAliaser": "70492f7f3eb058fb0a9193d8fa7ff5cfebe74925",
}


def resolve(name: str) -> Any:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(name)


def digest(value: Any) -> str:
    """SHA-1 of a function's or class's source; of a value's repr otherwise."""
    try:
        text = inspect.getsource(value)
    except TypeError:  # not code: a constant
        text = repr(value)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def changed_pins(pins: dict[str, str] = PINS) -> list[str]:
    """One line per pinned name whose code is missing or not the pinned code."""
    changed = []
    for name, pinned in pins.items():
        try:
            found = digest(resolve(name))
        except (ImportError, AttributeError):
            changed.append(f"{name}: missing")
            continue
        if found != pinned:
            changed.append(f"{name}: changed (sha1 {found}, pinned {pinned})")
    return changed


def test_the_botocore_code_the_fast_paths_rely_on_is_the_verified_code():
    changed = changed_pins()
    assert not changed, (
        f"botocore {botocore.__version__} is not the code messenger.fastboto was verified "
        f"against ({fastboto.VERIFIED_BOTOCORE}); re-verify as docs/fast-botocore.md says:\n"
        + "\n".join(changed))


def test_a_changed_or_missing_function_fails_naming_it(monkeypatch):
    # Given a botocore whose SigV4Auth.payload is other code and whose _host_from_url is gone
    def payload(self: Any, request: Any) -> str:
        return "UNSIGNED-PAYLOAD"

    monkeypatch.setattr(botocore.auth.SigV4Auth, "payload", payload)
    monkeypatch.delattr(botocore.auth, "_host_from_url")
    monkeypatch.setattr(botocore.auth, "SIGNED_HEADERS_BLACKLIST", ["expect", "user-agent"])
    # Then the check names those three, and only those
    changed = changed_pins()
    assert [line.split(":")[0] for line in changed] == [
        "botocore.auth.SigV4Auth.payload", "botocore.auth._host_from_url",
        "botocore.auth.SIGNED_HEADERS_BLACKLIST"]
    assert changed[1] == "botocore.auth._host_from_url: missing"


def test_the_package_docstring_lists_every_pinned_name():
    listed = " ".join((fastboto.__doc__ or "").split())
    missing = [name for name in PINS if name not in listed]
    assert not missing, missing


@pytest.mark.parametrize("module", ["signing", "responses", "serialize", "user_agent",
                                    "form_body", "retries", "headers"])
def test_every_private_name_a_fast_path_uses_is_listed(module):
    # Given every `_name` in the module's code that the module does not define itself
    source = inspect.getsource(importlib.import_module(f"messenger.fastboto.{module}"))
    defined = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    code = re.sub(r"#.*", "", re.sub(r'"""[\s\S]*?"""', "", source))
    used = set(re.findall(r"(?<![\w])\.?(_[A-Za-z]\w*)", code)) - defined
    # Then the package docstring names each (botocore's private names, listed with their owner)
    listed = " ".join((fastboto.__doc__ or "").split())
    missing = sorted(name for name in used if name not in listed)
    assert not missing, missing


if __name__ == "__main__":
    print(f"# botocore {botocore.__version__}")
    for name in PINS:
        line = f'    "{name}": "{digest(resolve(name))}",'
        print(line if len(line) <= 100 else line.replace(": ", ":\n        ", 1))
