"""`messenger dashboard`: the channels, workers and dead letters of a namespace in the browser.

    pip install 'messenger[dashboard]'
    messenger dashboard [--port 8080] [--refresh 5]     # http://127.0.0.1:8080/
    messenger dashboard --login                         # try the viewer and operator roles

A small Starlette app served by uvicorn on loopback with the engineer's own AWS credentials
(docs/dashboard.md). This module only parses the command and checks the optional extra; the
app lives in `messenger.tools.dashboard.app`, imported once the extra is known to be there, so
the runtime library never depends on it.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from messenger.errors import InvalidSettings

#: What `pip install 'messenger[dashboard]'` brings (import names).
EXTRA_MODULES = ("starlette", "uvicorn", "jinja2", "python_multipart", "jwt", "cryptography")
DEFAULT_PORT = 8080


class DashboardExtraMissing(InvalidSettings):
    """The optional dependencies of the dashboard are not installed."""


def require_extra() -> None:
    """Raise DashboardExtraMissing (one line) when a module of the extra is missing."""
    missing = []
    for name in EXTRA_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise DashboardExtraMissing(
            f"the dashboard needs its extra: pip install 'messenger[dashboard]' "
            f"(missing: {', '.join(missing)})")


def run_cli(args: argparse.Namespace) -> int:
    if not 1 <= args.port <= 65_535:
        raise InvalidSettings(f"--port must be 1 to 65535, got {args.port}")
    if not 1 <= args.refresh <= 3600:
        raise InvalidSettings(f"--refresh must be 1 to 3600 seconds, got {args.refresh}")
    require_extra()
    from messenger.tools.dashboard.app import serve

    return serve(args.host, args.port, refresh_seconds=args.refresh,
                 allowed_hosts=tuple(args.allowed_host or ()), login=args.login)


def add_parser(commands: Any) -> None:
    dashboard = commands.add_parser(
        "dashboard", help="serve the channels, workers and dead letters in the browser "
                          "(needs messenger[dashboard])")
    dashboard.add_argument("--port", type=int, default=DEFAULT_PORT,
                           help=f"port on loopback (default {DEFAULT_PORT})")
    dashboard.add_argument("--host", default="127.0.0.1",
                           help="address to bind (default 127.0.0.1; anything else lets other "
                                "machines act with your AWS credentials)")
    dashboard.add_argument("--allowed-host", action="append", metavar="NAME",
                           help="a host name or address browsers use to reach it (repeat; "
                                "needed with --host 0.0.0.0: other Host headers get 403)")
    dashboard.add_argument("--refresh", type=float, default=5.0, metavar="SECONDS",
                           help="seconds between the overview's updates (default 5)")
    dashboard.add_argument("--login", action="store_true",
                           help="sign in as a local viewer or operator at /local-login (the "
                                "deployed login's checks, with a key made here; "
                                "docs/dashboard.md)")
    dashboard.set_defaults(run=run_cli)
