"""GetResources by ARN on the local endpoint answers as AWS does (messenger.tools.moto_tagging).

AWS returns every named resource in one response and refuses more than 100 ARNs; stock moto
pages such a request by 100 tags. The queue alarm's call count (bench/ops.py) relies on the
former; `tags_by_arn` still follows a token, so it reads everything from stock moto too.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError

from messenger.aws import ClientFactory, RequestCounter
from messenger.ops.inventory import queue_arn, tags_by_arn
from messenger.tools.local import LocalProcess, start_local_process

#: Tags per queue: well over what a 100-tag page of stock moto holds for two queues.
TAGS = {f"tag-{n:02d}": f"value-{n}" for n in range(45)}


@pytest.fixture(scope="module")
def stock_endpoint() -> Iterator[LocalProcess]:
    server = start_local_process(stock_moto=True)
    yield server
    server.stop()


def make_queues(clients: ClientFactory, count: int) -> list[str]:
    """`count` queues with 45 tags each; their ARNs."""
    sqs = clients.client("sqs")
    with ThreadPoolExecutor(8) as pool:
        urls = list(pool.map(
            lambda n: sqs.create_queue(QueueName=f"tagged-{n:03d}", tags=TAGS)["QueueUrl"],
            range(count)))
    return [queue_arn(url, clients.region) for url in urls]


def test_a_request_naming_100_resources_is_answered_at_once(clients: ClientFactory) -> None:
    arns = make_queues(clients, 101)
    tagging = clients.client("resourcegroupstaggingapi")

    page = tagging.get_resources(ResourceARNList=arns[:100])

    assert "PaginationToken" not in page or not page["PaginationToken"]
    assert sorted(item["ResourceARN"] for item in page["ResourceTagMappingList"]) == arns[:100]
    assert all(len(item["Tags"]) == 45 for item in page["ResourceTagMappingList"])
    with pytest.raises(ClientError) as refused:
        tagging.get_resources(ResourceARNList=arns)
    assert refused.value.response["Error"]["Code"] == "InvalidParameterException"
    assert "at most 100 ARNs, got 101" in refused.value.response["Error"]["Message"]


def test_tags_by_arn_costs_one_call_per_100_resources(clients: ClientFactory) -> None:
    arns = make_queues(clients, 150)
    counter = RequestCounter().attach(clients)

    found = tags_by_arn(clients, [*arns, arns[0].replace("tagged-000", "gone")])

    assert counter.counts == {"resource-groups-tagging-api.GetResources": 2}
    assert sorted(found) == sorted(arns)  # a queue that does not exist is simply absent
    assert all(tags == TAGS for tags in found.values())


def test_tags_by_arn_follows_stock_motos_pages(stock_endpoint: LocalProcess) -> None:
    clients = ClientFactory("us-east-1", endpoint_url=stock_endpoint.url)
    arns = make_queues(clients, 10)
    counter = RequestCounter().attach(clients)

    found = tags_by_arn(clients, arns)

    assert sorted(found) == sorted(arns)
    assert all(tags == TAGS for tags in found.values())
    assert counter.counts["resource-groups-tagging-api.GetResources"] > 1  # paged by tags
