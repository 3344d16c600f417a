"""Batched CloudWatch reads: many metrics per GetMetricData call, never one call per queue.

moto does not emit SQS/SNS metrics; tests seed them with put_metric_data in AWS/SQS and AWS/SNS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: GetMetricData accepts at most 500 queries per call.
MAX_QUERIES_PER_CALL = 500
SQS_NAMESPACE = "AWS/SQS"
SNS_NAMESPACE = "AWS/SNS"


@dataclass(frozen=True)
class MetricRequest:
    """One CloudWatch series: namespace, metric, one dimension and a statistic ('Sum', ...)."""

    namespace: str
    metric: str
    dimension: str
    value: str
    stat: str

    def query(self, query_id: str, period: int) -> dict[str, Any]:
        return {
            "Id": query_id,
            "MetricStat": {
                "Metric": {
                    "Namespace": self.namespace,
                    "MetricName": self.metric,
                    "Dimensions": [{"Name": self.dimension, "Value": self.value}],
                },
                "Period": period,
                "Stat": self.stat,
            },
            "ReturnData": True,
        }


def sqs_metric(queue_name: str, metric: str, stat: str) -> MetricRequest:
    return MetricRequest(SQS_NAMESPACE, metric, "QueueName", queue_name, stat)


def sns_metric(topic_name: str, metric: str, stat: str) -> MetricRequest:
    return MetricRequest(SNS_NAMESPACE, metric, "TopicName", topic_name, stat)


def fetch_series(
    cloudwatch: Any,
    requests: Sequence[MetricRequest],
    start: datetime,
    end: datetime,
    period: int,
) -> list[list[float]]:
    """The datapoints of each request (newest first), in the order of `requests`.

    An empty list means CloudWatch has no datapoint in the window: *unknown*, not zero.
    Calls GetMetricData once per 500 requests (plus pages when CloudWatch splits a response).
    period: seconds per datapoint (a multiple of 60).
    """
    series: list[list[float]] = [[] for _ in requests]
    for offset in range(0, len(requests), MAX_QUERIES_PER_CALL):
        chunk = requests[offset : offset + MAX_QUERIES_PER_CALL]
        queries = [r.query(f"m{offset + i}", period) for i, r in enumerate(chunk)]
        token = ""
        while True:
            kwargs: dict[str, Any] = {
                "MetricDataQueries": queries,
                "StartTime": start,
                "EndTime": end,
                "ScanBy": "TimestampDescending",
            }
            if token:
                kwargs["NextToken"] = token
            response = cloudwatch.get_metric_data(**kwargs)
            for result in response.get("MetricDataResults", []):
                series[int(result["Id"][1:])].extend(float(v) for v in result.get("Values", []))
            token = response.get("NextToken") or ""
            if not token:
                break
    return series


def latest(values: Sequence[float]) -> float | None:
    """The newest datapoint of a series (fetched newest first), or None when there is none."""
    return values[0] if values else None


def total(values: Sequence[float]) -> float | None:
    """The sum of a series, or None when there is no datapoint (missing data is not zero)."""
    return sum(values) if values else None


def peak(values: Sequence[float]) -> float | None:
    return max(values) if values else None
