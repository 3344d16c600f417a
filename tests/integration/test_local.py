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


def test_the_endpoint_reads_motos_module_list_once_and_routes_as_before(monkeypatch):
    import os

    from moto import backends

    from messenger.tools.local import cache_module_list

    # Given moto's own listing of its service modules (a directory listing per call)
    found = backends.list_of_moto_modules
    monkeypatch.setattr(backends, "list_of_moto_modules", getattr(found, "original", found))
    listed = list(backends.list_of_moto_modules())
    calls = []
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: calls.append(path) or listdir(path))
    # When the endpoint caches it
    cache_module_list()
    cache_module_list()  # (a second endpoint in the process: still one listing)
    # Then every later call gives the same names in the same order, without listing again
    assert [list(backends.list_of_moto_modules()) for _ in range(3)] == [listed] * 3
    assert len(calls) == 1 and "sqs" in listed and "sns" in listed
