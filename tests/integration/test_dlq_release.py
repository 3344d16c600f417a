"""The end of a dead-letter read, against the local endpoint: a release that fails on one DLQ
does not leave the other DLQs' letters hidden (each DLQ's held letters are released on their own;
the first failure is raised after)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from messenger.operations.deadletters import DeadLetterWorkbench
from tests.faults import AccessDenied, injected
from tests.integration.test_dlq_concurrent_reads import prioritized
from tests.integration.test_dlq_workbench import counts


def test_a_release_refused_on_one_dlq_still_releases_the_others(settings, clients):
    # Given three levels with 2 letters each, the first level's DLQ refusing the release (SQS's
    # 403 AccessDenied, as a policy without sqs:ChangeMessageVisibility answers)
    levels = prioritized(settings, clients, per_level=2)
    bench = DeadLetterWorkbench("jobs", settings, clients)
    refused = bench.dlqs[0]
    refuse = AccessDenied(refused)
    released: list[str] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        released.append(params["QueueUrl"].rsplit("/", 1)[-1])

    # When the channel is listed (every letter read, then released)
    with injected(clients, "provide-client-params.sqs.ChangeMessageVisibilityBatch", record), \
            injected(clients, "before-send.sqs.ChangeMessageVisibilityBatch", refuse):
        with pytest.raises(ClientError, match="AccessDenied"):
            bench.list()
    # Then the other two levels' letters are visible again at once; the refused level's stay
    # hidden until their hold ends (never gone)
    assert released == bench.dlqs and refuse.refused == 1
    sqs = clients.client("sqs")
    assert [counts(sqs, level.dlq.url) for level in levels] == [(0, 2), (2, 0), (2, 0)]
