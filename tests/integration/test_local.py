"""`messenger local`: prints the endpoint to export, serves AWS APIs, stops cleanly on Ctrl-C."""

import signal

import boto3

from messenger.tools.local import LOCAL_CREDENTIALS, start_local_process


def test_local_endpoint_serves_and_stops_on_ctrl_c():
    server = start_local_process()
    try:
        sqs = boto3.client(
            "sqs",
            endpoint_url=server.url,
            region_name="us-east-1",
            aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        sqs.create_queue(QueueName="hello")
        assert sqs.list_queues()["QueueUrls"][0].endswith("/hello")
        assert server.url.startswith("http://127.0.0.1:")
    finally:
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=10) == 0
