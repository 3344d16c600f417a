"""A client's User-Agent header built once per set of feature ids: the header botocore builds.

botocore rebuilds the whole User-Agent string on every request, twice (once for the request,
again after the request registered its feature ids, e.g. the retry mode): ~8% of an SQS call's
client CPU. Everything in it but those feature ids is fixed when the client is made
(`UserAgentString.to_string`; the ids come from `botocore.context.get_context().features`,
read by `_build_feature_metadata`), so the string is kept per feature set.
tests/integration/test_producer.py compares the header sent with a plain boto3 client's.
"""

from __future__ import annotations

from typing import Any

from botocore.context import get_context

#: Distinct feature sets whose User-Agent string a client keeps (a client sees a handful).
USER_AGENTS_KEPT = 64


def reuse_user_agent(client: Any) -> bool:
    """Have a botocore client build its User-Agent string once per set of feature ids; True
    when it now does. A botocore client without `_user_agent_creator.to_string` is left
    alone."""
    creator = getattr(client, "_user_agent_creator", None)
    build = getattr(creator, "to_string", None)
    if creator is None or not callable(build):
        return False
    built: dict[frozenset[str], str] = {}

    def to_string() -> str:
        context = get_context()
        features = frozenset(context.features) if context is not None else frozenset()
        found = built.get(features)
        if found is None:
            found = build()
            if len(built) < USER_AGENTS_KEPT:
                built[features] = found
        return found

    creator.to_string = to_string
    return True
