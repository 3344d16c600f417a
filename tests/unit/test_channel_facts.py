"""The channel facts issues 52 and 53 add to `ChannelSpec`: keep_results and the flow-control
declarations, each checked with one clear message and carried as a tag of the channel's queue."""

import pytest

from messenger import InvalidChannelSpec, JobFailed, RateLimited
from messenger.channel import (
    TAG_KEEP_RESULTS,
    TAG_MAX_CONCURRENCY,
    TAG_RATE_LIMIT,
    TAG_TENANT_RATE_LIMIT,
    ChannelSpec,
    declared_keep_results,
    parse_rate,
)


def test_the_facts_are_tags_of_the_queue_and_keep_results_of_the_dlq_too():
    spec = ChannelSpec("orders", track_status=True, keep_results=True, max_concurrency=8,
                       rate_limit="100/s", tenant_rate_limit="120/min")
    queue, dlq = spec.resource_tags("queue"), spec.resource_tags("dlq")
    assert queue[TAG_KEEP_RESULTS] == dlq[TAG_KEEP_RESULTS] == "true"
    assert queue[TAG_MAX_CONCURRENCY] == "8"
    assert queue[TAG_RATE_LIMIT] == "100/s"
    assert queue[TAG_TENANT_RATE_LIMIT] == "120/min"
    assert TAG_RATE_LIMIT not in dlq
    assert declared_keep_results(queue) is True
    assert declared_keep_results({}) is None


def test_a_channel_without_facts_declares_none_but_keep_results_false():
    tags = ChannelSpec("orders").resource_tags("queue")
    assert tags[TAG_KEEP_RESULTS] == "false"
    assert not {TAG_MAX_CONCURRENCY, TAG_RATE_LIMIT, TAG_TENANT_RATE_LIMIT} & set(tags)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"keep_results": True}, "keep_results needs track_status=True"),
    ({"keep_results": "yes", "track_status": True}, "keep_results must be True or False"),
    ({"max_concurrency": 0}, "max_concurrency must be from 1 to 10000"),
    ({"max_concurrency": 2.5}, "max_concurrency must be a whole number"),
    ({"rate_limit": "100"}, "rate_limit must be 'N/s', 'N/min' or 'N/h'"),
    ({"rate_limit": "0/s"}, "rate_limit must be more than 0"),
    ({"tenant_rate_limit": "5/day"}, "tenant_rate_limit must be 'N/s', 'N/min' or 'N/h'"),
])
def test_each_wrong_fact_is_refused_naming_its_field(kwargs, message):
    with pytest.raises(InvalidChannelSpec, match=message):
        ChannelSpec("orders", **kwargs)


def test_rates_parse_to_per_second():
    assert parse_rate("100/s").per_second == 100
    assert parse_rate("120/min").per_second == 2
    assert parse_rate(" 36 / h ").per_second == pytest.approx(0.01)
    assert str(parse_rate("2.5/s")) == "2.5/s"


def test_job_failed_and_rate_limited_say_what_happened():
    failed = JobFailed("j-1", "dead_lettered", reason="failed: attempts used up (3 of 3)",
                       error_type="ValueError", error="bad row")
    assert str(failed) == "job j-1 dead lettered: ValueError: bad row"
    assert failed.reason.startswith("failed: attempts used up")
    assert str(JobFailed("j-2", "cancelled", reason="cancelled by ana")) == \
        "job j-2 cancelled: cancelled by ana"
    assert RateLimited(30).retry_after == 30.0
    with pytest.raises(ValueError, match="retry_after must be a number of seconds"):
        RateLimited(-1)
