"""The local endpoint publishes SQS's and SNS's CloudWatch metrics as AWS does (over HTTP)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

from messenger.tools import moto_metrics

SQS_METRICS = ("ApproximateNumberOfMessagesVisible", "ApproximateNumberOfMessagesNotVisible",
               "ApproximateNumberOfMessagesDelayed", "ApproximateAgeOfOldestMessage",
               "NumberOfMessagesSent", "NumberOfMessagesReceived", "NumberOfMessagesDeleted",
               "NumberOfEmptyReceives")
SNS_METRICS = ("NumberOfMessagesPublished", "NumberOfNotificationsDelivered")


def _read(cloudwatch, namespace, dimension, name, metrics):
    now = datetime.now(UTC)
    queries = [{"Id": f"m{n}", "Label": metric, "MetricStat": {
        "Metric": {"Namespace": namespace, "MetricName": metric,
                   "Dimensions": [{"Name": dimension, "Value": name}]},
        "Period": 60, "Stat": "Maximum" if metric.startswith("Approximate") else "Sum"}}
        for n, metric in enumerate(metrics)]
    answer = cloudwatch.get_metric_data(MetricDataQueries=queries, EndTime=now,
                                        StartTime=now - timedelta(minutes=10))
    # a gauge's samples may span two minutes (the sampler runs at each minute): its largest
    return {r["Label"]: (max if r["Label"].startswith("Approximate") else sum)(r["Values"])
            if r["Values"] else None for r in answer["MetricDataResults"]}


def test_sqs_and_sns_metrics_carry_aws_names_dimensions_and_minutes(settings, clients):
    # Given a topic with two queues subscribed, one through a filter nothing matches
    sqs, sns, cloudwatch = (clients.client(s) for s in ("sqs", "sns", "cloudwatch"))
    ns = settings.namespace
    topic = sns.create_topic(Name=f"{ns}-events")["TopicArn"]
    urls = {}
    for name in ("all", "none"):
        urls[name] = sqs.create_queue(QueueName=f"{ns}-{name}")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=urls[name], AttributeNames=["QueueArn"])
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn["Attributes"]["QueueArn"],
                      Attributes={"FilterPolicy": json.dumps({"kind": ["never"]})}
                      if name == "none" else {})
    # When 2 messages are published, 3 sent directly, 2 received, 1 deleted, 1 delayed,
    # and a poll of the empty queue
    for _ in range(2):
        sns.publish(TopicArn=topic, Message="{}")
    for _ in range(3):
        sqs.send_message(QueueUrl=urls["all"], MessageBody="{}")
    sqs.send_message(QueueUrl=urls["all"], MessageBody="{}", DelaySeconds=60)
    received = sqs.receive_message(QueueUrl=urls["all"], MaxNumberOfMessages=2)["Messages"]
    sqs.delete_message(QueueUrl=urls["all"], ReceiptHandle=received[0]["ReceiptHandle"])
    sqs.receive_message(QueueUrl=urls["none"], WaitTimeSeconds=0)

    # Then GetMetricData finds each under AWS's name and dimension
    queue = _read(cloudwatch, "AWS/SQS", "QueueName", f"{ns}-all", SQS_METRICS)
    assert {k: v for k, v in queue.items() if k != "ApproximateAgeOfOldestMessage"} == {
        "ApproximateNumberOfMessagesVisible": 3.0, "ApproximateNumberOfMessagesNotVisible": 1.0,
        "ApproximateNumberOfMessagesDelayed": 1.0, "NumberOfMessagesSent": 6.0,
        "NumberOfMessagesReceived": 2.0, "NumberOfMessagesDeleted": 1.0,
        "NumberOfEmptyReceives": None}
    assert 0 <= queue["ApproximateAgeOfOldestMessage"] < 60
    assert _read(cloudwatch, "AWS/SQS", "QueueName", f"{ns}-none",
                 ["NumberOfEmptyReceives", "NumberOfMessagesSent"]) == {
        "NumberOfEmptyReceives": 1.0, "NumberOfMessagesSent": None}
    assert _read(cloudwatch, "AWS/SNS", "TopicName", f"{ns}-events", SNS_METRICS) == {
        "NumberOfMessagesPublished": 2.0, "NumberOfNotificationsDelivered": 2.0}
    # one datapoint per minute, stamped with the minute's start (1-minute resolution)
    stats = cloudwatch.get_metric_statistics(
        Namespace="AWS/SQS", MetricName="NumberOfMessagesSent",
        Dimensions=[{"Name": "QueueName", "Value": f"{ns}-all"}], Period=60,
        StartTime=datetime.now(UTC) - timedelta(minutes=10), EndTime=datetime.now(UTC),
        Statistics=["Sum"])
    assert sum(p["Sum"] for p in stats["Datapoints"]) == 6.0


def test_metrics_written_by_hand_are_left_alone(settings, clients):
    # Given a queue holding 2 messages whose depth a test wrote by hand (AWS refuses that)
    sqs, cloudwatch = clients.client("sqs"), clients.client("cloudwatch")
    name = f"{settings.namespace}-simulated"
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    for _ in range(2):
        sqs.send_message(QueueUrl=url, MessageBody="{}")
    cloudwatch.put_metric_data(Namespace="AWS/SQS", MetricData=[{
        "MetricName": "ApproximateNumberOfMessagesVisible", "Value": 500,
        "Dimensions": [{"Name": "QueueName", "Value": name}],
        "Timestamp": datetime.now(UTC) - timedelta(minutes=3)}])
    # Then only the hand-written datapoint is there
    assert _read(cloudwatch, "AWS/SQS", "QueueName", name,
                 ["ApproximateNumberOfMessagesVisible", "NumberOfMessagesSent"]) == {
        "ApproximateNumberOfMessagesVisible": 500.0, "NumberOfMessagesSent": None}


def test_other_moto_versions_publish_nothing(monkeypatch, caplog):
    import moto
    from moto.sqs import models

    monkeypatch.setattr(moto, "__version__", "5.3.0")
    monkeypatch.setattr(moto_metrics, "_applied", False)
    stock_send = models.SQSBackend.send_message
    with caplog.at_level(logging.WARNING, logger=moto_metrics.__name__):
        applied = moto_metrics.apply()
    assert applied is False and models.SQSBackend.send_message is stock_send
    assert "moto 5.3.0 is not 5.2.5" in caplog.text


def test_messenger_top_shows_rates_from_the_published_metrics(settings, clients):
    # Given a channel sent 10 messages, 4 of them received, nothing written to CloudWatch
    from messenger import ChannelSpec
    from messenger.operations.snapshot import snapshot
    from messenger.provision import Provisioner

    channel = Provisioner(clients, settings).ensure_channel(
        ChannelSpec("rates", namespace=settings.namespace))
    sqs = clients.client("sqs")
    sqs.send_message_batch(QueueUrl=channel.queue.url, Entries=[
        {"Id": str(n), "MessageBody": "{}"} for n in range(10)])
    sqs.receive_message(QueueUrl=channel.queue.url, MaxNumberOfMessages=4)
    # Then `messenger top` reads the rates and the consumer activity SQS would publish
    [row] = snapshot(clients, settings)
    assert row.queue == channel.queue.name
    assert row.in_per_minute == 2.0 and row.consumers_active is True  # 10 in 5 minutes
