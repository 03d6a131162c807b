"""The web UI's routes: server-rendered pages, the forms that act, sign-in, and the vendored assets.

Pages: ``/`` (fleet map), ``/ui/nodes/{node}``, ``/ui/held``, ``/ui/breaker``, ``/ui/verdicts``,
``/ui/jobs``. A request with the header ``X-Gpufleet-Fragment: 1`` gets only the page's live part
(``static/live.js`` fetches it every few seconds). Forms POST to ``/ui/...`` and answer with a redirect
back to the page (303), so a reload never repeats an action. Everything an action does goes through the
same controller method as the matching ``/v1`` route and is audited under the signed-in token's name.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qsl, quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from gpufleet import __version__
from gpufleet.controller.api.auth import READ
from gpufleet.controller.api.errors import response_for
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.service import Controller
from gpufleet.controller.store.repo import Page
from gpufleet.correlate.model import WATCH_DECADES
from gpufleet.domain.errors import GpufleetError, InvalidInput
from gpufleet.lifecycle.engine import OperatorOp

from . import pages
from .goodput import goodput_views
from .session import CSRF_FIELD, Session, forged, safe_next, session_of, sign_in, sign_out

FRAGMENT_HEADER = "x-gpufleet-fragment"
REFRESH_SECONDS = 5
_ASSETS = {"live.js": "text/javascript", "style.css": "text/css"}
_OPS = {"drain": OperatorOp.DRAIN, "resume": OperatorOp.RESUME, "repair-complete": OperatorOp.REPAIR_DONE,
        "retire": OperatorOp.RETIRE, "burn-in": OperatorOp.BURN_IN}
# No inline script or style, nothing from another origin: the page works air-gapped and an injected
# <script> would not run.
_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def _env() -> Environment:
    env = Environment(loader=PackageLoader("gpufleet.controller.web", "templates"),
                      autoescape=select_autoescape(default=True), trim_blocks=True, lstrip_blocks=True)
    env.filters["ago"] = _ago
    env.globals["switches"] = pages.switches
    # An operator's actor_id already names the role ("operator:alice"); the policy's is a bare name.
    env.globals["who"] = lambda r: r.actor_id if ":" in r.actor_id else f"{r.actor}:{r.actor_id}"
    env.filters["when"] = lambda t: t.strftime("%Y-%m-%d %H:%M:%S") if t else "—"
    return env


def _ago(delta: Any) -> str:
    if delta is None:
        return "never"
    s = int(delta.total_seconds())
    if s < 0:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s // size} {unit} ago"
    return f"{s} s ago"


def install(app: FastAPI, controller: Controller, reconciler: Reconciler | None) -> None:
    """Serve the web UI from ``app`` (see the module docstring for its routes)."""
    env = _env()
    c = controller
    router = APIRouter(include_in_schema=False)

    def render(request: Request, template: str, title: str, session: Session | None, **ctx: Any) -> HTMLResponse:
        fragment = request.headers.get(FRAGMENT_HEADER) == "1"
        breaker = c.breaker
        html = env.get_template(template).render(
            fragment=fragment, title=title, session=session, version=__version__, path=request.url.path,
            breaker=breaker, dry_run=c.dry_run, refresh=REFRESH_SECONDS, csrf_field=CSRF_FIELD,
            now=c.clock.now(), **ctx)
        return HTMLResponse(html, headers=_HEADERS)

    def page(path: str, template: str, title: str, build: Callable[..., dict[str, Any]], *,
             query: tuple[str, ...] = ()) -> None:
        """``build`` gets the path's parameters and the ``query`` parameters named (as strings)."""
        async def view(request: Request) -> Response:
            session = session_of(request)
            if session is None:
                if request.headers.get(FRAGMENT_HEADER) == "1":
                    return Response("sign in again", status_code=401, headers=_HEADERS)
                return RedirectResponse(f"/ui/login?next={quote(request.url.path)}", status_code=303)
            try:
                args = {**request.path_params, **{q: request.query_params.get(q, "") for q in query}}
                # in a worker thread: a page reads the store, and the node page waits for the controller's
                # lock, which an ingest round or a correlation rebuild holds for a while (the event loop
                # must keep serving heartbeats and events meanwhile)
                ctx = await run_in_threadpool(build, **args)
            except GpufleetError as err:
                return _error(request, env, session, err)
            return render(request, template, title.format(**request.path_params), session, **ctx)

        router.add_api_route(path, view, methods=["GET"], response_class=HTMLResponse, name=template)

    page("/", "fleet.html", "fleet", lambda: {"map": pages.fleet_map(c)})

    def node(node: str) -> dict[str, Any]:
        shown = pages.node_page(c, node)
        return {"page": shown, "ops": list(_OPS), "inventory": pages.inventory_rows(shown)}

    page("/ui/nodes/{node}", "node.html", "{node}", node)
    page("/ui/held", "held.html", "held decisions", lambda: {"groups": pages.held_groups(c),
                                                             "held": len(c.engine.held)})
    page("/ui/breaker", "breaker.html", "breaker and dry run", lambda: {
        "held": len(c.engine.held), "audit": c.store.audit(page=Page(15))})  # the count, not one page
    page("/ui/verdicts", "verdicts.html", "correlation verdicts", lambda: {"verdicts": pages.verdicts(c),
                                                                           "watching": c.watching(WATCH_DECADES)})
    page("/ui/jobs", "jobs.html", "jobs", lambda find: {"jobs": pages.jobs(c, reconciler, find[:200]),
                                                        "goodput": goodput_views(c)}, query=("find",))

    # ---- actions (operator) ------------------------------------------------------------------
    def action(path: str, act: Callable[[Session, dict[str, str], list[str], dict[str, Any]], str]) -> None:
        async def post(request: Request) -> Response:
            session = session_of(request)
            if session is None:
                return RedirectResponse("/ui/login", status_code=303)
            pairs = parse_qsl((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
            form = dict(pairs)
            why = forged(session, request, form)
            if why is not None:
                return _error(request, env, session, None, 403, f"refused: {why}")
            if not session.may_operate:
                return _error(request, env, session, None, 403,
                              f"role {session.caller.role} may only look; acting needs an operator's token")
            try:
                back = act(session, form, [v for k, v in pairs if k == "node"], dict(request.path_params))
            except GpufleetError as err:
                return _error(request, env, session, err)
            return RedirectResponse(back, status_code=303)

        router.add_api_route(path, post, methods=["POST"])

    def approve(s: Session, form: dict[str, str], nodes: list[str], _: dict[str, Any]) -> str:
        component = form.get("component", "")
        chosen = nodes or c.engine.held_group(f"correlate:{component}")
        if not chosen:
            raise InvalidInput("node", "", "one or more nodes with a held decision, or a correlated component")
        c.approve_held(chosen, s.actor_id)
        return "/ui/held"

    def cancel(s: Session, form: dict[str, str], nodes: list[str], _: dict[str, Any]) -> str:
        if not nodes:
            raise InvalidInput("node", "", "a node with a held decision")
        for n in nodes:
            c.cancel_held(n, s.actor_id, form.get("reason", ""))
        return "/ui/held"

    def reset(s: Session, form: dict[str, str], _n: list[str], _p: dict[str, Any]) -> str:
        c.reset_breaker(s.actor_id, discard_held=form.get("discard_held") == "on")
        return "/ui/breaker"

    def mode(s: Session, form: dict[str, str], _n: list[str], _p: dict[str, Any]) -> str:
        value = form.get("dry_run", "")
        if value not in ("on", "off"):
            raise InvalidInput("dry_run", value, "on or off")
        c.set_dry_run(value == "on", s.actor_id)
        return "/ui/breaker"

    def operate(s: Session, form: dict[str, str], _n: list[str], params: dict[str, Any]) -> str:
        node, op = str(params["node"]), form.get("op", "")
        if op not in _OPS:
            raise InvalidInput("op", op, f"one of {', '.join(_OPS)}")
        c.operate(node, _OPS[op], s.actor_id, form.get("reason", ""))
        return f"/ui/nodes/{quote(node)}"

    action("/ui/held/approve", approve)
    action("/ui/held/cancel", cancel)
    action("/ui/breaker/reset", reset)
    action("/ui/mode", mode)
    action("/ui/nodes/{node}/operate", operate)

    # ---- signing in ------------------------------------------------------------------------------
    @router.get("/ui/login", response_class=HTMLResponse)
    async def login_form(request: Request, next: str = "/") -> HTMLResponse:
        return render(request, "login.html", "sign in", None, next=safe_next(next), failed=False)

    @router.post("/ui/login")
    async def login(request: Request) -> Response:
        form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
        token = form.get("token", "").strip()
        registry = request.app.state.tokens
        caller = registry.caller(token) if token else None
        if caller is None or caller.role not in READ or caller.tenant is not None:  # the UI is fleet-wide
            out = render(request, "login.html", "sign in", None, next=safe_next(form.get("next", "/")), failed=True)
            out.status_code = 401
            return out
        response = RedirectResponse(safe_next(form.get("next", "/")), status_code=303)
        sign_in(response, request, token)
        return response

    @router.post("/ui/logout")
    async def logout() -> Response:
        response = RedirectResponse("/ui/login", status_code=303)
        sign_out(response)
        return response

    @router.get("/ui/static/{name}")
    async def asset(name: str) -> Response:
        if name not in _ASSETS:
            return Response("not found", status_code=404)
        body = files("gpufleet.controller.web").joinpath("static", name).read_bytes()
        return Response(body, media_type=_ASSETS[name], headers={"cache-control": "max-age=3600",
                                                                  "x-content-type-options": "nosniff"})

    app.include_router(router)


def _error(request: Request, env: Environment, session: Session | None, err: GpufleetError | None,
           status: int = 0, text: str = "") -> HTMLResponse:
    """An error page with the status the API would answer for the same error (api/errors.py)."""
    if err is not None:
        status, text = response_for(err).status_code, str(err)
    html = env.get_template("error.html").render(fragment=False, title="error", session=session, version=__version__,
                                                 path=request.url.path, message=text, status=status,
                                                 csrf_field=CSRF_FIELD, refresh=0)
    return HTMLResponse(html, status_code=status, headers=_HEADERS)
