"""Security headers on every dashboard response (pages, fragments, static assets, error pages
and the Host check's refusal): another origin cannot frame a page (clickjacking: two lured clicks
on a framed letter page would delete it), and nothing is loaded from elsewhere."""

from __future__ import annotations

import pytest
import requests

from tests.dashboard import served

pytest.importorskip("starlette", reason="the dashboard extra is not installed")


def test_every_response_forbids_framing(settings, clients):
    with served(settings, clients) as dash:
        responses = [
            requests.get(dash.url + path, timeout=30)
            for path in ("/", "/fragment/channels", "/static/dashboard.css", "/nowhere",
                         "/channels/nope", "/job?id=")
        ]
        # The Host check answers before the app: its 403 carries them too
        responses.append(requests.get(dash.url + "/", timeout=30,
                                      headers={"Host": f"evil.example:{dash.port}"}))
        # So does a refused action
        responses.append(requests.post(dash.url + "/channels/x/delete", data={}, timeout=30))
    assert [r.status_code for r in responses] == [200, 200, 200, 404, 404, 400, 403, 403]
    for response in responses:
        policy = response.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in policy, response.url
        assert "default-src 'self'" in policy
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_html_in_every_field_is_shown_as_text(settings, clients):
    from tests.integration.test_dashboard_bulk import letter
    from tests.integration.test_dlq_workbench import channel

    # Given a letter whose id, reason, error and body carry markup
    evil = "<img src=x onerror=alert(1)>"
    resources = channel(settings, clients)
    letter(clients.client("sqs"), resources.dlq.url, f"id-{evil}", {"note": evil},
           error_type=f"Err{evil}", reason=f"reason {evil}")
    with served(settings, clients) as dash:
        pages = [requests.get(dash.url + path, timeout=30, params=params) for path, params in (
            ("/channels/orders", {}),
            ("/channels/orders/select", {"text": "onerror"}),
            ("/search", {"text": "onerror"}),
            ("/job", {"id": f"id-{evil}", "channel": "orders"}),
        )]
    for page in pages:
        assert page.status_code == 200, page.url
        # Then it is text on every page, never markup
        assert evil not in page.text, page.url
        assert "&lt;img src=x onerror=alert(1)&gt;" in page.text, page.url


def test_bound_to_every_address_it_serves_the_hosts_named(settings, local_endpoint):
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.dashboard import free_port

    # Given `messenger dashboard --host 0.0.0.0 --allowed-host dash.internal`
    port = free_port()
    env = {**os.environ, **local_endpoint.env(), "MESSENGER_NAMESPACE": settings.namespace}
    process = subprocess.Popen(
        [sys.executable, "-m", "messenger", "dashboard", "--host", "0.0.0.0", "--port",
         str(port), "--allowed-host", "dash.internal"], env=env, stdout=subprocess.PIPE,
        text=True)
    try:
        assert process.stdout is not None
        assert f"at http://127.0.0.1:{port}/" in process.stdout.readline()
        deadline = time.monotonic() + 30
        while True:
            try:
                named = requests.get(f"http://127.0.0.2:{port}/", timeout=30,
                                     headers={"Host": f"dash.internal:{port}"})
                break
            except requests.ConnectionError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
        # Then a browser using that name is served (on another address too), others get 403
        assert named.status_code == 200
        assert requests.get(f"http://127.0.0.2:{port}/", timeout=30, headers={
            "Host": f"evil.example:{port}"}).status_code == 403
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
