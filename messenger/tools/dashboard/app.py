"""The dashboard's web app, a view over the library's public names: pages read through the
queue snapshot, the worker registry, the dead-letter workbench and the status store
(`messenger.operations`, `messenger.jobs`); actions go through the workbench and the
Requeuer, so they keep the CLI's never-lose rule (a message leaves a DLQ only after its queue
accepted it).

Safety (docs/dashboard.md): every request's Host header must be `127.0.0.1:<port>` or
`localhost:<port>` (a DNS-rebinding page has its own host name there); every action is a POST
carrying this process's random token (another site cannot read it, so cannot forge the form)
and an Origin, when the browser sends one, of the same two hosts; an action first renders a
confirmation page and runs only when that page's form comes back with `confirmed=yes`.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from messenger.aws import ClientFactory
from messenger.errors import ChannelNotFound, DeadLetterNotFound, InvalidSettings, MessengerError
from messenger.jobs.controls import CancelRequests
from messenger.jobs.job_view import JobReader
from messenger.jobs.limits import LIMIT_FIELDS, LimitStore, LimitsView, check_limit
from messenger.jobs.schedule_store import ScheduleStore
from messenger.jobs.status import StatusStore, running_channel
from messenger.jobs.workers import list_workers
from messenger.operations.audit import DEFAULT_DAYS, RETENTION_DAYS, AuditEntry, AuditTrail
from messenger.operations.deadletters import DeadLetterListing, DeadLetterWorkbench, read_channels
from messenger.operations.flow import channel_limits, require_declared
from messenger.operations.history import WINDOWS, channel_history
from messenger.operations.pause import pause, paused_channels, resume
from messenger.operations.progress import describe_progress
from messenger.operations.queues import channel_queues
from messenger.operations.scheduled import cancel_scheduled
from messenger.operations.selection import (
    DEFAULT_PER_CHANNEL,
    DEFAULT_SCAN,
    MAX_SCAN,
    LetterFilter,
    SearchQuery,
    search,
    select,
)
from messenger.operations.snapshot import channel_dlq_rows, requeue_rows, snapshot
from messenger.settings import Settings
from messenger.tools.dashboard.auth import (
    LOCAL_OPERATOR,
    AlbIdentity,
    Identity,
    Unauthenticated,
)
from messenger.tools.dashboard.charts import chart
from messenger.tools.dashboard.local_login import LocalLogin
from messenger.tools.format import due_text, duration_text

HERE = Path(__file__).parent
#: Dead letters a channel page lists at first, and at most (one scan holds them all briefly).
PAGE_SIZE = 50
MAX_LETTERS = 1000
#: Ids one action may name (more: 400, nothing changed; docs/dashboard.md): a confirmation
#: page lists each, and one action's audit entry keeps them all. A filter's preview picks at
#: most this many. The longest id accepted (SQS ids are 36, messenger's <= 128).
MAX_IDS = 100
MAX_ID_LENGTH = 200
#: The audit page's default and largest number of entries.
AUDIT_PAGE = 100
MAX_AUDIT_PAGE = 1000

logger = logging.getLogger(__name__)


class AuditUnavailable(MessengerError):
    """The audit trail cannot be written: an action is not run (503, nothing changed)."""


#: The deployed dashboard's action token (double-submit: a cookie only this site can set and
#: read, echoed by its forms), since the app's instances share no process token.
CSRF_COOKIE = "__Host-messenger-csrf"


@dataclass
class Dashboard:
    """What the pages share: settings, clients, this process's action token, allowed hosts.

    identity: None locally (loopback; the user is the local operator); deployed, the verifier of
    the load balancer's signed identity header (every request without a valid one gets 401).
    local_login: locally, a stand-in for the load balancer's sign-in (`messenger dashboard
    --login`): the app is then the deployed one (identity = its verifier), on loopback.
    """

    settings: Settings
    clients: ClientFactory
    port: int
    refresh_seconds: float = 5.0
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    extra_hosts: tuple[str, ...] = ()
    identity: AlbIdentity | None = None
    local_login: LocalLogin | None = None
    _audit_ready: bool = field(default=False, repr=False)

    @property
    def deployed(self) -> bool:
        return self.identity is not None

    @property
    def allowed_hosts(self) -> set[str]:
        return {f"{host}:{self.port}" for host in ("127.0.0.1", "localhost", *self.extra_hosts)}

    def workbench(self, channel: str, actor: str = "") -> DeadLetterWorkbench:
        return DeadLetterWorkbench(channel, self.settings, self.clients, actor=actor)

    def audit_trail(self) -> AuditTrail:
        return AuditTrail(self.clients, self.settings)

    def ensure_audit(self) -> None:
        """Check (once per process) that the audit trail can be written: its table exists
        (deployed: the stack made it) or is created (locally, provisioning=auto); else
        AuditUnavailable and no action runs."""
        if self._audit_ready:
            return
        try:
            self.audit_trail().ensure()
        except (MessengerError, ClientError, BotoCoreError) as error:
            raise AuditUnavailable(f"the audit trail cannot be written ({error}), so no action "
                                   f"runs") from None
        self._audit_ready = True

    def record(self, entry: AuditEntry) -> str:
        """Append `entry` to the audit trail: '' when written, else why not (also logged)."""
        try:
            self.audit_trail().record(entry)
        except Exception as error:  # noqa: BLE001 - said on the page and in the log
            logger.error("audit entry not written: %s: %s (%s)", type(error).__name__, error,
                         entry.line())
            return f"{type(error).__name__}: {error}"
        return ""


class Authenticate:
    """Puts the request's identity and action token in `request.state` (`identity`, `csrf`).

    Locally: the local operator and this process's token. Deployed: the identity the load
    balancer's signed header names (else 401, nothing served) and the token of the request's
    CSRF cookie (set on the response when the browser has none yet)."""

    def __init__(self, app: ASGIApp, dashboard: Dashboard) -> None:
        self.app = app
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        verifier = self.dashboard.identity
        if verifier is None:
            state.update(identity=LOCAL_OPERATOR, csrf=self.dashboard.token)
            await self.app(scope, receive, send)
            return
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1"))
                   for k, v in scope.get("headers") or []]
        try:
            from starlette.concurrency import run_in_threadpool

            identity = await run_in_threadpool(verifier.identify, headers)
        except Unauthenticated as error:
            response = HTMLResponse(_page_text("Sign-in required", f"{error}. Nothing was "
                                               f"served."), 401)
            await response(scope, receive, send)
            return
        from starlette.requests import cookie_parser

        cookie = cookie_parser(dict(headers).get("cookie", "")).get(CSRF_COOKIE, "")
        fresh = len(cookie) < 32
        state.update(identity=identity, csrf=secrets.token_urlsafe(32) if fresh else cookie)

        async def with_cookie(message: Message) -> None:
            if fresh and message["type"] == "http.response.start":
                value = (f"{CSRF_COOKIE}={state['csrf']}; Path=/; Secure; HttpOnly; "
                         f"SameSite=Strict")
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"set-cookie", value.encode())]}
            await send(message)

        await self.app(scope, receive, with_cookie)


class HostCheck:
    """403 for any request whose Host header is not one of the dashboard's own (DNS rebinding:
    a hostile name resolving to 127.0.0.1 arrives with that name as its Host)."""

    def __init__(self, app: ASGIApp, allowed: set[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            host = headers.get(b"host", b"").decode("latin-1").lower()
            if host not in self.allowed:
                response = HTMLResponse(
                    _page_text("Forbidden", f"Host {host!r} is not this dashboard's; use "
                               f"{sorted(self.allowed)[0]!r}. Nothing changed."), 403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


#: Sent on every response, error pages included. `frame-ancestors 'none'` (and the older
#: X-Frame-Options) stops another origin from framing a page and luring clicks onto its
#: buttons (clickjacking); scripts, styles and images come from this origin only (no CDN).
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # (not no-referrer: with it, browsers send "Origin: null" on the forms' own POSTs)
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every HTTP response of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message = {**message, "headers": [
                    *message.get("headers", []),
                    *((k, v) for k, v in self.headers if k not in names)]}
            await send(message)

        await self.app(scope, receive, with_headers)


def _page_text(title: str, text: str) -> str:
    from html import escape

    return (f"<!doctype html><title>{escape(title)}</title><h1>{escape(title)}</h1>"
            f"<p class=error>{escape(text)}</p>")


def build_app(dashboard: Dashboard) -> ASGIApp:
    """The ASGI app (routes, templates, static assets, error pages, host check)."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["age"] = duration_text
    templates.env.filters["due_in"] = due_text
    templates.env.filters["clock"] = lambda at: time.strftime("%Y-%m-%d %H:%M:%S",
                                                              time.gmtime(at))
    templates.env.filters["utc"] = _utc
    templates.env.filters["pretty"] = lambda body: (
        body if isinstance(body, str) else json.dumps(body, indent=2, ensure_ascii=False))

    def render(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.update(namespace=dashboard.settings.namespace or "(no namespace)",
                       token=request.state.csrf, refresh=dashboard.refresh_seconds,
                       user=request.state.identity, deployed=dashboard.deployed)
        if name not in FRAGMENTS:  # every page names the paused channels (one tag query)
            context["paused"] = _paused(dashboard)
        return templates.TemplateResponse(request, name, context, status_code=status)

    def problem(request: Request, status: int, title: str, text: str) -> Response:
        return render(request, "problem.html", status, title=title, text=text)

    # -- pages ------------------------------------------------------------------------------
    def overview(request: Request) -> Response:
        return render(request, "overview.html", rows=snapshot(dashboard.clients,
                                                              dashboard.settings))

    def channel_rows(request: Request) -> Response:
        return render(request, "channel_rows.html", rows=snapshot(dashboard.clients,
                                                                  dashboard.settings))

    def channel(request: Request) -> Response:
        name = request.path_params["channel"]
        limit = _int_param(request.query_params.get("limit"), "limit", PAGE_SIZE, MAX_LETTERS)
        listing = _listing(dashboard, name, limit)
        # A prioritized channel's workers register under its name and serve every level's queue.
        workers = list_workers(dashboard.clients, dashboard.settings, name)
        rows = snapshot(dashboard.clients, dashboard.settings, name)
        return render(request, "channel.html", channel=name, listing=listing, workers=workers,
                      rows=rows, limit=limit, next_limit=min(MAX_LETTERS, limit + PAGE_SIZE),
                      max_letters=MAX_LETTERS, now=time.time(),
                      limits=_limits(dashboard, name), limit_fields=LIMIT_FIELDS)

    # Live parts of the channel and job pages (dashboard.js replaces them every --refresh s).
    def channel_counts(request: Request) -> Response:
        return render(request, "channel_rows.html", rows=snapshot(
            dashboard.clients, dashboard.settings, request.path_params["channel"]))

    def channel_workers(request: Request) -> Response:
        name = request.path_params["channel"]
        return render(request, "channel_workers.html", now=time.time(),
                      workers=list_workers(dashboard.clients, dashboard.settings, name))

    def channel_limits(request: Request) -> Response:
        return render(request, "channel_limits.html", limit_fields=LIMIT_FIELDS,
                      limits=_limits(dashboard, request.path_params["channel"]))

    def job_timeline(request: Request) -> Response:
        store = StatusStore(dashboard.clients, dashboard.settings)
        job = _id(request.query_params.get("id", ""))
        timeline = store.timeline(job) if store.exists() else []
        # The cancel button comes and goes with the live timeline (a job starting, ending).
        return render(request, "job_live.html", letter_id=job, timeline=timeline,
                      running=running_channel(timeline), job=_job_view(dashboard, job),
                      progress=describe_progress(dashboard.clients, dashboard.settings, timeline))

    def letter(request: Request) -> Response:
        name, letter_id = request.path_params["channel"], request.path_params["letter_id"]
        found, body, timeline = dashboard.workbench(name).show(_id(letter_id))
        return render(request, "letter.html", channel=name, letter=found, body=body,
                      timeline=timeline)

    def lookup(request: Request) -> Response:
        letter_id = _id(request.query_params.get("id", "").strip())
        name = request.query_params.get("channel", "").strip()
        store = StatusStore(dashboard.clients, dashboard.settings)
        timeline = store.timeline(letter_id) if store.exists() else []
        channels = [name] if name else list(dict.fromkeys(r.channel for r in timeline))

        def shown(candidate: str) -> tuple[Any, Any, Any] | None:
            try:
                return dashboard.workbench(candidate).show(letter_id)
            except (ChannelNotFound, DeadLetterNotFound):
                if name:
                    raise
                return None

        # Every channel at once (each read ends with a 1 s long poll); the first in the
        # timeline's order that holds the letter is shown.
        searched = []
        for candidate, shown_letter in zip(channels, read_channels(channels, shown), strict=True):
            if shown_letter is None:
                searched.append(candidate)
                continue
            found, body, records = shown_letter
            return render(request, "letter.html", channel=candidate, letter=found, body=body,
                          timeline=records)
        job = _job_view(dashboard, letter_id)
        if not timeline and not job:  # (a job held for its dependencies has no record yet)
            return problem(request, 404, "Not found",
                           f"no status recorded for {letter_id!r}; name its channel to search "
                           f"that channel's dead letters")
        return render(request, "lookup.html", letter_id=letter_id, timeline=timeline,
                      searched=searched, running=running_channel(timeline), job=job,
                      progress=describe_progress(dashboard.clients, dashboard.settings, timeline))

    def group_view(request: Request, part: str = "group.html") -> Response:
        group_id = _id(request.path_params["group_id"])
        found = JobReader(dashboard.clients, dashboard.settings).group(group_id)
        if found is None:
            return problem(request, 404, "Not found", f"no group {group_id!r} (a group's id "
                           f"is what Producer.group returned; its members are "
                           f"'<group id>.<n>')")
        return render(request, part, group=found)

    def group_progress(request: Request) -> Response:
        return group_view(request, "group_live.html")

    def selection(request: Request) -> Response:
        """A filter's preview: exactly the letters (by SQS MessageId) an action would name."""
        name = request.path_params["channel"]
        params = request.query_params
        limit = _int_param(params.get("limit"), "limit", DEFAULT_SCAN, MAX_SCAN)
        chosen = LetterFilter.from_form(params)
        picked = select(dashboard.workbench(name), chosen, limit)
        return render(request, "select.html", channel=name, selection=picked, form=params,
                      limit=limit, now=time.time(), max_ids=MAX_IDS)

    def history(request: Request) -> Response:
        name = request.path_params["channel"]
        window = request.query_params.get("window", "hour")
        found = channel_history(dashboard.clients, dashboard.settings, name, window)
        return render(request, "history.html", channel=name, history=found,
                      charts=[chart(found, s) for s in found.series.values()],
                      windows=list(WINDOWS))

    def scheduled(request: Request, part: str = "scheduled.html") -> Response:
        """The channel's one-time jobs waiting in EventBridge Scheduler, soonest first."""
        name = request.path_params["channel"]
        jobs = ScheduleStore(dashboard.clients, dashboard.settings).list(name)
        return render(request, part, channel=name, jobs=jobs, now=time.time())

    def scheduled_jobs(request: Request) -> Response:
        """The scheduled page's list and Cancel button (dashboard.js replaces them every
        --refresh s, keeping the boxes the operator ticked)."""
        return scheduled(request, "scheduled_jobs.html")

    def finder(request: Request) -> Response:
        params = request.query_params
        if not any(params.get(k) for k in ("job_id", "error_type", "text")):
            return render(request, "search.html", result=None, form=params,
                          per_channel=DEFAULT_PER_CHANNEL)
        per_channel = _int_param(params.get("per_channel"), "per_channel",
                                 DEFAULT_PER_CHANNEL, MAX_SCAN)
        query = SearchQuery.from_form(params)
        # A factory of its own: the requests it counts are this search's only.
        own = ClientFactory(dashboard.clients.region, dashboard.clients.endpoint_url)
        result = search(own, dashboard.settings, query, per_channel)
        return render(request, "search.html", result=result, form=params,
                      per_channel=per_channel, now=time.time())

    # -- actions ----------------------------------------------------------------------------
    async def action(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        user: Identity = request.state.identity
        form = await request.form()
        name, kind = request.path_params["channel"], request.path_params["action"]
        ids = list(dict.fromkeys(str(v) for v in form.getlist("ids")))
        confirmed = form.get("confirmed") == "yes"
        why = "" if user.operator else f"{user.name} is a {user.role}: only operators may act"
        why = why or _check_action(request, form, dashboard)
        if why:
            # Every refused attempt is in the audit trail (who, what it named, why).
            await run_in_threadpool(dashboard.record, audit_entry(
                user, kind, name, ids, "refused",
                why + ("" if confirmed else " (confirmation page)")))
            return problem(request, 403, "Forbidden", why + "; nothing changed")
        return await run_in_threadpool(_act, request, name, kind, ids, confirmed, user, form)

    def audited(request: Request, user: Identity, kind: str, name: str, targets: list[str],
                run: Callable[[], tuple[str, dict[str, Any], str, str]]) -> Response:
        """Run a confirmed action and append its entry to the audit trail: `run` returns the
        template, its context, the result (done, partial, failed) and one line of detail.
        An action whose entry cannot be written is not run (AuditUnavailable: 503); one that
        ran but whose entry then failed says so on its page."""
        dashboard.ensure_audit()
        try:
            template, context, result, detail = run()
        except Exception as error:
            dashboard.record(audit_entry(user, kind, name, targets, "failed",
                                         f"{type(error).__name__}: {error}"))
            raise
        missing = dashboard.record(audit_entry(user, kind, name, targets, result, detail))
        return render(request, template, audit_error=missing, **context)

    def _act(request: Request, name: str, kind: str, ids: list[str], confirmed: bool,
             user: Identity, form: FormData) -> Response:
        actor = user.name
        if kind == "limits":
            return _set_limits(request, name, confirmed, user, form)
        if kind in ("requeue", "delete"):
            ids = _action_ids(ids, "dead letters")
            bench = dashboard.workbench(name, actor)
            if not confirmed:
                return render(request, "confirm.html", channel=name, kind=kind, ids=ids,
                              dlqs=bench.dlqs)

            def move_or_delete() -> tuple[str, dict[str, Any], str, str]:
                if kind == "requeue":
                    reports = bench.requeue(ids)
                    return ("result.html", dict(channel=name, kind=kind, reports=reports),
                            *_requeue_result(reports))
                deleted = bench.delete(ids)
                result = "done" if deleted == len(ids) else "partial" if deleted else "failed"
                return ("result.html", dict(channel=name, kind=kind, deleted=deleted,
                                            dlqs=bench.dlqs), result,
                        f"deleted {deleted} of {len(ids)} from {', '.join(bench.dlqs)}")

            return audited(request, user, kind, name, ids, move_or_delete)
        if kind == "requeue-all":
            rows = channel_dlq_rows(dashboard.clients, dashboard.settings, name)
            if not confirmed:
                return render(request, "confirm.html", channel=name, kind=kind, ids=[],
                              rows=rows)

            def move_all() -> tuple[str, dict[str, Any], str, str]:
                reports = requeue_rows(dashboard.clients, dashboard.settings, rows, actor=actor)
                return ("result.html", dict(channel=name, kind=kind, reports=reports),
                        *_requeue_result(reports))

            return audited(request, user, kind, name, [str(r.dlq) for r in rows], move_all)
        if kind == "cancel-scheduled":
            ids = _action_ids(ids, "scheduled jobs")
            if not confirmed:
                return render(request, "confirm.html", channel=name, kind=kind, ids=ids)

            def cancel_jobs() -> tuple[str, dict[str, Any], str, str]:
                report = cancel_scheduled(dashboard.clients, dashboard.settings, ids, name,
                                          actor=actor)
                outcomes = [(o.job_id, o.cancelled, o.text) for o in report.outcomes]
                return ("result.html", dict(channel=name, kind=kind, cancelled=outcomes),
                        report.result, report.summary())

            return audited(request, user, kind, name, ids, cancel_jobs)
        if kind in ("pause", "resume"):
            if not confirmed:
                return render(request, "confirm.html", channel=name, kind=kind, ids=[])

            def switch() -> tuple[str, dict[str, Any], str, str]:
                act = pause if kind == "pause" else resume
                report = act(dashboard.clients, dashboard.settings, name, actor=actor)
                result = "done" if report.ok else "partial" if report.queues else "failed"
                return ("control.html", dict(channel=name, kind=kind, report=report), result,
                        report.summary().replace("\n", "; "))

            return audited(request, user, kind, name, [], switch)
        if kind == "cancel-job":
            ids = _action_ids(ids, "running jobs")
            channel_queues(dashboard.clients, dashboard.settings, name)  # ChannelNotFound: 404
            if not confirmed:
                return render(request, "confirm.html", channel=name, kind=kind, ids=ids)

            def cancel_running() -> tuple[str, dict[str, Any], str, str]:
                requests = CancelRequests(dashboard.clients, dashboard.settings, name)
                made = [requests.request(job_id, actor) for job_id in ids]
                return ("control.html", dict(channel=name, kind=kind,
                                             requested=[(m.message_id, m.by) for m in made]),
                        "done", f"cancel requested for {len(made)} running job(s); each "
                                f"consumer stops its job at its next heartbeat")

            return audited(request, user, kind, name, ids, cancel_running)
        return problem(request, 404, "Not found", f"no action {kind!r} (requeue, requeue-all, "
                                                  f"delete, cancel-scheduled, pause, resume, "
                                                  f"cancel-job, limits); nothing changed")

    def _set_limits(request: Request, name: str, confirmed: bool, user: Identity,
                    form: FormData) -> Response:
        """An operator's change of a channel's limits (`LimitStore.set`): each field given is
        checked (400 naming it), confirmed, then set and audited (action 'limits', the changes
        as targets)."""
        channel = channel_queues(dashboard.clients, dashboard.settings, name)[0].channel
        changes = {field: check_limit(field, str(form.get(field, "")).strip())
                   for field in LIMIT_FIELDS if str(form.get(field, "")).strip()}
        cleared = tuple(field for field in LIMIT_FIELDS if field in form.getlist("clear")
                        and field not in changes)
        if not changes and not cleared:
            raise InvalidSettings(f"limits: give a value for one of {', '.join(LIMIT_FIELDS)} "
                                  f"(or 'none'), or clear one")
        current = _limits(dashboard, channel)
        assert current is not None  # its queues were just found
        if changes:
            require_declared(current)
        targets = [f"{field}={value}" for field, value in changes.items()] + [
            f"{field}=declared" for field in cleared]
        if not confirmed:
            return render(request, "confirm.html", channel=name, kind="limits", ids=[],
                          changes=changes, cleared=cleared, limits=current)

        def change() -> tuple[str, dict[str, Any], str, str]:
            store = LimitStore(dashboard.clients, dashboard.settings)
            store.ensure()  # locally (auto) made on first use; deployed, the stack's
            store.set(channel, by=user.name, clear=cleared, **changes)
            view = _limits(dashboard, channel)
            assert view is not None  # its queues were just found
            now = view.limits.as_text()
            return ("control.html", dict(channel=name, kind="limits", limits=view,
                                         limit_fields=LIMIT_FIELDS), "done",
                    "; ".join(f"{field} {now[field] or 'none'}" for field in LIMIT_FIELDS
                              if field in changes or field in cleared)
                    + " (consumers follow within 5 s)")

        return audited(request, user, "limits", channel, targets, change)

    def audit_page(request: Request) -> Response:
        params = request.query_params
        limit = _int_param(params.get("limit"), "limit", AUDIT_PAGE, MAX_AUDIT_PAGE)
        days = _int_param(params.get("days"), "days", DEFAULT_DAYS, RETENTION_DAYS)
        channel = params.get("channel") or None
        actor = params.get("actor") or None
        entries = dashboard.audit_trail().recent(limit=limit, days=days, channel=channel,
                                                 actor=actor)
        return render(request, "audit.html", entries=entries, limit=limit, days=days,
                      form=params, table=dashboard.audit_trail().table)

    # -- errors -----------------------------------------------------------------------------
    async def not_found(request: Request, error: Exception) -> Response:
        return problem(request, 404, "Not found", f"{error}")

    async def audit_unavailable(request: Request, error: Exception) -> Response:
        return problem(request, 503, "Audit trail unavailable", f"{error}; nothing changed")

    async def bad_request(request: Request, error: Exception) -> Response:
        return problem(request, 400, "Bad request", f"{error}; nothing changed")

    async def aws_error(request: Request, error: Exception) -> Response:
        return problem(request, 502, "AWS error", f"{error}")

    async def http_error(request: Request, error: Exception) -> Response:
        status = getattr(error, "status_code", 500)
        return problem(request, status, "Not found" if status == 404 else "Error",
                       f"{getattr(error, 'detail', error)}")

    app = Starlette(
        routes=[
            Route("/", overview),
            Route("/fragment/channels", channel_rows),
            Route("/fragment/channels/{channel}/counts", channel_counts),
            Route("/fragment/channels/{channel}/workers", channel_workers),
            Route("/fragment/channels/{channel}/scheduled", scheduled_jobs),
            Route("/fragment/channels/{channel}/limits", channel_limits),
            Route("/fragment/job", job_timeline),
            Route("/fragment/groups/{group_id:path}", group_progress),
            Route("/groups/{group_id:path}", group_view),
            Route("/job", lookup),
            Route("/search", finder),
            Route("/audit", audit_page),
            Route("/channels/{channel}/select", selection),
            Route("/channels/{channel}/history", history),
            Route("/channels/{channel}/scheduled", scheduled),
            Route("/channels/{channel}", channel),
            Route("/channels/{channel}/letters/{letter_id:path}", letter),
            Route("/channels/{channel}/{action}", action, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        exception_handlers={
            ChannelNotFound: not_found, DeadLetterNotFound: not_found,
            AuditUnavailable: audit_unavailable,
            MessengerError: bad_request, ClientError: aws_error, BotoCoreError: aws_error,
            404: http_error, 405: http_error,
        },
    )
    authenticated = Authenticate(app, dashboard)
    if dashboard.local_login is not None:
        # On loopback, the local load balancer signs users in (module local_login).
        return SecurityHeaders(HostCheck(dashboard.local_login.wrap(
            authenticated, dashboard.allowed_hosts), dashboard.allowed_hosts))
    if dashboard.deployed:
        # Behind the load balancer: the Host is the dashboard's domain; the signed header, not
        # the address, decides who may read.
        return SecurityHeaders(authenticated)
    return SecurityHeaders(HostCheck(authenticated, dashboard.allowed_hosts))


#: Templates that are parts of a page (live updates): they carry no paused-channel banner.
FRAGMENTS = frozenset({"channel_rows.html", "channel_workers.html", "timeline.html",
                       "job_live.html", "scheduled_jobs.html", "channel_limits.html",
                       "group_live.html"})


def audit_entry(user: Identity, kind: str, channel: str, targets: list[str], result: str,
                detail: str) -> AuditEntry:
    """The audit entry of `user`'s action (or attempt) `kind` on `channel` naming `targets`."""
    return AuditEntry(at=time.time(), action=kind, channel=channel, actor=user.name,
                      result=result, detail=detail, targets=tuple(targets), sub=user.subject,
                      email=user.email, email_verified=user.email_verified, role=str(user.role))


def _requeue_result(reports: list[Any]) -> tuple[str, str]:
    """The result and detail of requeue reports: done (all moved), partial or failed."""
    moved = sum(r.moved for r in reports)
    left = sum(r.failed + r.in_flight for r in reports)
    result = "done" if not left else "partial" if moved else "failed"
    return result, "; ".join(r.summary() for r in reports) or "nothing to requeue"


def _listing(dashboard: Dashboard, channel: str, limit: int) -> DeadLetterListing:
    """The channel page's dead letters. A prioritized channel's levels are read at once (each
    read ends with an empty 1 s long poll; in turn, three levels took 3.1 s), each up to
    `limit`, and listed in the levels' order, the first `limit` of them."""
    levels = [q.queue for q in channel_queues(dashboard.clients, dashboard.settings, channel)]
    if len(levels) <= 1:
        return dashboard.workbench(channel).list(limit=limit)

    def read(level: str) -> DeadLetterListing | None:
        try:
            return dashboard.workbench(level).list(limit=limit)
        except ChannelNotFound:  # a level without a DLQ
            return None

    parts = [part for part in read_channels(levels, read) if part is not None]
    if not parts:
        return dashboard.workbench(channel).list(limit=limit)  # says why (ChannelNotFound)
    letters = [letter for part in parts for letter in part.letters]
    return DeadLetterListing(
        letters[:limit], not_seen=sum(p.not_seen for p in parts),
        fifo_blocked=sum(p.fifo_blocked for p in parts),
        stopped_at_limit=len(letters) > limit or any(p.stopped_at_limit for p in parts),
        dlqs=[dlq for part in parts for dlq in part.dlqs])


def _job_view(dashboard: Dashboard, job_id: str) -> dict[str, Any]:
    """The job's outcome (result or error), dependencies and dependents (`jobs.job_view`):
    {} when it has none of them."""
    return JobReader(dashboard.clients, dashboard.settings).job(job_id) if job_id else {}


def _paused(dashboard: Dashboard) -> dict[str, str]:
    """The namespace's paused channels → "paused by <who> at <time>" (one tag query)."""
    return {channel: str(mark) for channel, mark in
            paused_channels(dashboard.clients, dashboard.settings).items()}


def _limits(dashboard: Dashboard, name: str) -> LimitsView | None:
    """The channel's limits, where each comes from, its consumers' current rate and jobs
    waiting; None for a name no queue is tagged with (the page says so elsewhere)."""
    return channel_limits(dashboard.clients, dashboard.settings, name)


def _check_action(request: Request, form: FormData, dashboard: Dashboard) -> str:
    """Why this POST may not act ('' when it may): the token, and the Origin when sent."""
    token = form.get("token")
    expected: str = request.state.csrf
    if not isinstance(token, str) or not hmac.compare_digest(token.encode(), expected.encode()):
        return "missing or wrong action token (reload the page: the dashboard was restarted?)"
    origin = request.headers.get("origin")
    if origin is None:
        return ""
    if dashboard.deployed:
        # Behind the load balancer the browser spoke HTTPS (X-Forwarded-Proto says so).
        scheme = request.headers.get("x-forwarded-proto") or request.url.scheme
        if origin != f"{scheme}://{request.headers.get('host', '')}":
            return f"request from another site ({origin!r})"
    elif origin.removeprefix("http://") not in dashboard.allowed_hosts:
        return f"request from another site ({origin!r})"
    return ""


def _utc(at: float) -> Markup:
    """A time in UTC, marked up so the page's script can show the local time on hover."""
    moment = time.gmtime(at)
    return Markup(f'<time datetime="{time.strftime("%Y-%m-%dT%H:%M:%SZ", moment)}">'
                  f'{time.strftime("%Y-%m-%d %H:%M:%S", moment)}</time>')


def _id(value: str) -> str:
    """One id a request names (a dead letter's, a job's), checked: InvalidSettings (400) else."""
    if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise InvalidSettings(f"an id is 1 to {MAX_ID_LENGTH} printable characters")
    return value


def _action_ids(ids: list[str], what: str) -> list[str]:
    """The ids an action names, checked: 1 to MAX_IDS of them (`what` they are, in the error),
    each an id (`_id`); InvalidSettings (400, nothing changed) else."""
    if not ids or len(ids) > MAX_IDS:
        raise InvalidSettings(f"name 1 to {MAX_IDS} {what} per action, got {len(ids)}")
    return [_id(i) for i in ids]


def _int_param(raw: str | None, name: str, default: int, maximum: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= maximum:
        raise InvalidSettings(f"{name} must be 1 to {maximum}, got {raw!r}")
    return value


@contextmanager
def running(dashboard: Dashboard, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve `dashboard` from a thread of this process for the block (tests, benchmarks);
    yields its URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(build_app(dashboard), host=host, port=dashboard.port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="messenger-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:  # uvicorn offers no event to wait on
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard did not start on {host}:{dashboard.port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{dashboard.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def serve(host: str, port: int, refresh_seconds: float = 5.0,
          allowed_hosts: tuple[str, ...] = (), login: bool = False) -> int:
    """Serve the dashboard until Ctrl-C (SIGINT) or SIGTERM. allowed_hosts: names browsers may
    use besides 127.0.0.1/localhost (and `host` itself when it is a name or address). login:
    sign in as a local viewer or operator (`LocalLogin`) instead of being the local operator."""
    import uvicorn

    settings = Settings.from_env()
    wildcard = host in ("0.0.0.0", "::", "")
    own = () if wildcard or host in ("127.0.0.1", "localhost") else (host,)
    shown = "127.0.0.1" if wildcard else host
    local_login = LocalLogin(port, shown) if login else None
    dashboard = Dashboard(settings, ClientFactory(settings.region), port, refresh_seconds,
                          extra_hosts=(*own, *allowed_hosts),
                          identity=local_login.identity() if local_login else None,
                          local_login=local_login)
    print(f"messenger dashboard for namespace {settings.namespace or '(none)'!r} at "
          f"http://{shown}:{port}/ (Ctrl-C stops)", flush=True)
    if local_login is not None:
        print(f"messenger dashboard: sign in as a viewer or an operator at "
              f"http://{shown}:{port}/local-login", flush=True)
    if wildcard and not allowed_hosts:
        print(f"messenger dashboard: bound to {host}, but browsers elsewhere get 403 until you "
              f"name the host they use: --allowed-host <name or address>", flush=True)
    uvicorn.run(build_app(dashboard), host=host, port=port, log_level="warning",
                access_log=False, server_header=False)
    return 0
