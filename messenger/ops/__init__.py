"""Operations logic shared by the ops Lambdas and tools: boto3 only, no Lambda runtime needed.

- `inventory`: platform-owned queues and topics, found by their `messenger:*` tags.
- `metrics`: batched CloudWatch GetMetricData (up to 500 queries per call).
- `queue_alarm`: queues deeper than their alarm threshold.
- `cleaner`: unused topics and queues, classified, deleted or reported.
- `findings`: the report types both fill.
- `report`: Slack Block Kit messages for both, and their plain-text preview.
- `slack`: posting a message to a Slack incoming webhook (needs slack_sdk).
- `settings`: the Lambdas' typed settings.
"""
