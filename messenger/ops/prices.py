"""The price table: AWS list prices in us-east-1 for what the platform is billed for, dated.

Every dollar figure of `bench/dollars.py` and `messenger cost` is a billed quantity (`Usage`)
multiplied by this table, and by nothing else. Each price names the AWS pricing page it is
listed on. List prices only: no free tier (SQS's first million requests a month, Lambda's
400,000 GB-seconds, ...), no volume tier past the first, no Savings Plans or Spot.

PRICES_CHECKED is the day these figures were last compared with their sources. The official
pages could not be opened from the machine that wrote this table; the figures were checked
against 2026 reproductions of them (cloudburn.io's SQS and Fargate guides, March 2026; vantage.sh's
Fargate page; airbyte.com's DynamoDB page, which has the on-demand prices AWS halved in
November 2024). Re-check them against the pages named before quoting a figure to a customer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date

PRICES_CHECKED = date(2026, 11, 27)
REGION = "us-east-1"

#: SQS and SNS bill each started 64 KiB of a request's payload as one request.
BILLING_CHUNK_BYTES = 64 * 1024
#: DynamoDB: a write request unit writes up to 1 KB, a read request unit reads up to 4 KB
#: (strongly consistent; an eventually consistent read is half a unit).
WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
GB = 1024**3

SQS_PAGE = "https://aws.amazon.com/sqs/pricing/"
SNS_PAGE = "https://aws.amazon.com/sns/pricing/"
KMS_PAGE = "https://aws.amazon.com/kms/pricing/"
S3_PAGE = "https://aws.amazon.com/s3/pricing/"
DYNAMODB_PAGE = "https://aws.amazon.com/dynamodb/pricing/on-demand/"
LAMBDA_PAGE = "https://aws.amazon.com/lambda/pricing/"
FARGATE_PAGE = "https://aws.amazon.com/fargate/pricing/"
API_GATEWAY_PAGE = "https://aws.amazon.com/api-gateway/pricing/"
EVENTBRIDGE_PAGE = "https://aws.amazon.com/eventbridge/pricing/"
CLOUDWATCH_PAGE = "https://aws.amazon.com/cloudwatch/pricing/"


@dataclass(frozen=True)
class Price:
    """One list price: `dollars` per `per` units of `unit`, as `source` lists it."""

    dollars: float
    per: int
    unit: str
    source: str

    @property
    def per_unit(self) -> float:
        return self.dollars / self.per


#: The billed quantities, by the key `Usage` counts them under.
PRICES: Mapping[str, Price] = {
    "sqs.request": Price(0.40, 1_000_000, "SQS standard request (64 KiB chunk)", SQS_PAGE),
    "sqs.fifo_request": Price(0.50, 1_000_000, "SQS FIFO request (64 KiB chunk)", SQS_PAGE),
    "sns.publish": Price(0.50, 1_000_000, "SNS standard publish (64 KiB chunk)", SNS_PAGE),
    # Deliveries to SQS queues and Lambda functions are listed at no charge.
    "sns.delivery_sqs": Price(0.0, 1_000_000, "SNS delivery to an SQS queue", SNS_PAGE),
    "kms.request": Price(0.03, 10_000, "KMS API request (symmetric key)", KMS_PAGE),
    "s3.put": Price(0.005, 1_000, "S3 Standard PUT, COPY, POST, LIST request", S3_PAGE),
    "s3.get": Price(0.0004, 1_000, "S3 Standard GET, HEAD and other request", S3_PAGE),
    "s3.gb_month": Price(0.023, 1, "S3 Standard storage, GB-month (first 50 TB)", S3_PAGE),
    "dynamodb.write_unit": Price(0.625, 1_000_000, "DynamoDB on-demand write request unit",
                                 DYNAMODB_PAGE),
    "dynamodb.read_unit": Price(0.125, 1_000_000, "DynamoDB on-demand read request unit",
                                DYNAMODB_PAGE),
    "lambda.request": Price(0.20, 1_000_000, "Lambda request", LAMBDA_PAGE),
    "lambda.gb_second": Price(0.0000166667, 1, "Lambda x86 duration, GB-second", LAMBDA_PAGE),
    "fargate.vcpu_hour": Price(0.04048, 1, "Fargate Linux/x86 vCPU-hour", FARGATE_PAGE),
    "fargate.gb_hour": Price(0.004445, 1, "Fargate Linux/x86 memory GB-hour", FARGATE_PAGE),
    "apigateway.rest_request": Price(3.50, 1_000_000, "API Gateway REST API request "
                                     "(first 333 million)", API_GATEWAY_PAGE),
    "scheduler.invocation": Price(1.00, 1_000_000, "EventBridge Scheduler invocation",
                                  EVENTBRIDGE_PAGE),
    "cloudwatch.metric_read": Price(0.01, 1_000, "CloudWatch GetMetricData metric requested",
                                    CLOUDWATCH_PAGE),
}


def chunks(payload_bytes: int) -> int:
    """Billed SQS or SNS requests for one request carrying `payload_bytes` (at least 1)."""
    return max(1, math.ceil(payload_bytes / BILLING_CHUNK_BYTES))


class Usage(dict[str, float]):
    """Billed quantities by price key ('sqs.request': 120, 's3.gb_month': 0.3, ...)."""

    def add(self, key: str, amount: float = 1.0) -> None:
        if key not in PRICES:
            raise KeyError(f"no price for {key!r}: one of {', '.join(sorted(PRICES))}")
        self[key] = self.get(key, 0.0) + amount

    def plus(self, others: Iterable[Mapping[str, float]]) -> Usage:
        total = Usage(self)
        for other in others:
            for key, amount in other.items():
                total.add(key, amount)
        return total

    def scaled(self, factor: float) -> Usage:
        return Usage({key: amount * factor for key, amount in self.items()})

    def dollars(self, prices: Mapping[str, Price] = PRICES) -> dict[str, float]:
        """Dollars per price key (unrounded)."""
        return {key: amount * prices[key].per_unit for key, amount in sorted(self.items())}

    def total_dollars(self, prices: Mapping[str, Price] = PRICES) -> float:
        return sum(self.dollars(prices).values())


def price_table() -> list[dict[str, object]]:
    """The table as rows (key, price, per, unit, source) with the date it was checked."""
    return [{"key": key, "dollars": price.dollars, "per": price.per, "unit": price.unit,
             "source": price.source, "checked": PRICES_CHECKED.isoformat(), "region": REGION}
            for key, price in PRICES.items()]
