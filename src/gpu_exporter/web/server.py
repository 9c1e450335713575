"""The HTTP endpoint shared by the agent and the bridge: one that a slow or hostile client cannot starve.

- At most ``max_connections`` connections are served at once, each on its own thread, so threads and
  memory stop growing at the cap. When a new connection finds the cap reached, the connection that has
  waited longest for its request is closed to make room (a half-open connection holds a slot only until
  a real client needs it); when every slot is busy answering, the newcomer gets a quick 503.
- A request must arrive in full within ``read_timeout`` of the connection (TLS handshake included), and
  a keep-alive connection may stay idle for ``idle_timeout``; a sweep on the server thread closes the
  ones past their deadline however slowly they trickle bytes.
- It serves on one listening socket or several (``--web.listen-address`` given more than once, or the
  sockets systemd passes: ``listeners.py``, ``activation.py``), all accepted on one thread, under one
  cap and one set of counters. The listen backlog is 128. A request that announces a body gets its answer and the connection is
  closed, so that the body is never read as a further request.
- TLS, basic auth, extra headers and the rate limit come from the web config (``webconfig.py``) and can be
  replaced while serving (``set_web``). /healthz and /readyz stay open without credentials and outside the
  rate limit, for probes: under RequireAndVerifyClientCert too, where every other path answers 403
  without a client certificate.
- Password checks run on a small bounded pool (``authpool.py``): a connection whose check waits there is
  closed to make room like one waiting for its request (after those), and a check the full queue cannot
  take is answered 429 at once. Remembered pairs (right or recently wrong) never wait (``auth.py``).
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from typing import Any

from gpu_exporter.web.auth import AuthState, BasicAuth, Verdict
from gpu_exporter.web.authpool import Job
from gpu_exporter.web.listeners import bind_all, describe, parse_listen
from gpu_exporter.web.ratelimit import RateLimiter
from gpu_exporter.web.servermetrics import ServerCollector
from gpu_exporter.web.webconfig import WebConfig

__all__ = ["Limits", "ServerCollector", "Site", "WebServer", "accepts_gzip", "parse_listen"]

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
_BUSY_AUTH = {"Retry-After": "1"}
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n"


@dataclass(frozen=True)
class Limits:
    max_connections: int = 64
    read_timeout: float = 10.0
    idle_timeout: float = 120.0


@dataclass
class Site:
    """What the endpoint serves: the metrics page, readiness, and the index page's title."""

    telemetry_path: str
    page: Callable[[bool], bytes]  # accept_gzip -> body (gzip-compressed when True)
    ready: Callable[[], tuple[bool, str]]
    title: str = "gpu-exporter"
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    # Accept header -> (page, content type): another format for the clients that ask (OpenMetrics)
    negotiate: Callable[[str | None], tuple[Callable[[bool], bytes], str]] | None = None


def accepts_gzip(header: str | None) -> bool:
    """True when ``Accept-Encoding`` allows gzip: listed (or ``*``) with a q-value above 0."""
    best: float | None = None
    star: float | None = None
    for item in (header or "").split(","):
        coding, _, params = item.strip().partition(";")
        coding = coding.strip().lower()
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding == "gzip" or coding == "x-gzip":
            best = q if best is None else max(best, q)
        elif coding == "*":
            star = q
    chosen = best if best is not None else star
    return chosen is not None and chosen > 0


class _Conn:
    __slots__ = ("deadline", "job", "refused", "since", "sock", "waiting")

    def __init__(self, sock: socket.socket, deadline: float, since: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.waiting = True  # waiting for (the rest of) a request; False while one is answered
        self.since = since  # when it began waiting
        self.refused = False  # its last answer refused it (401, 403, 429): first to go for a newcomer
        self.job: Job | None = None  # its password check, while that waits in the pool

    def set_job(self, job: Job | None) -> None:
        self.job = job

    def kill(self) -> None:
        try:
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)  # wakes the thread blocked in recv or send
        except OSError:
            pass


class _Handler(BaseHTTPRequestHandler):
    server: WebServer
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection
    disable_nagle_algorithm = True  # headers and body leave at once, no 40 ms delayed-ACK stall

    def parse_request(self) -> bool:
        ok = super().parse_request()
        conn = self.server.conn_of(self.request)
        if conn is not None:
            conn.waiting = False
            # a client that stops reading the answer is closed by the sweep too (no per-socket timeout:
            # it would cost a poll() before every read of every scrape)
            limits = self.server.limits
            conn.deadline = time.monotonic() + limits.read_timeout + limits.idle_timeout
        if ok and (
            self.headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in self.headers
        ):
            self.close_connection = True  # never read a body as the next request
        return ok

    def handle_one_request(self) -> None:
        super().handle_one_request()
        conn = self.server.conn_of(self.request)
        if conn is not None:
            now = time.monotonic()
            conn.deadline = now + self.server.limits.idle_timeout
            conn.since = now
            conn.waiting = True

    def version_string(self) -> str:
        """The Server header: the product only, no version of it or of Python."""
        return "gpu-exporter"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        srv = self.server
        site = srv.site
        tls = srv.tls
        if path not in OPEN_PATHS and tls is not None and tls.files.requires_client_cert and not self._peer_cert():
            srv.stats.auth_failures += 1
            self._send(403, b"client certificate required\n")
            return
        if path not in OPEN_PATHS and not self._admitted(srv):
            return
        if path == site.telemetry_path:
            accept = accepts_gzip(self.headers.get("Accept-Encoding"))
            page, content_type = site.page, site.content_type
            if site.negotiate is not None:
                page, content_type = site.negotiate(self.headers.get("Accept"))
            body = page(accept)
            headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
            if accept:
                headers["Content-Encoding"] = "gzip"
            self._send(200, body, headers)
        elif path == "/healthz":
            self._send(200, b"ok\n")
        elif path == "/readyz":
            ready, why = site.ready()
            self._send(200 if ready else 503, (why + "\n").encode())
        elif path == "/":
            link = site.telemetry_path.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
            html = (
                f"<html><head><title>{site.title}</title></head><body><h1>{site.title}</h1>"
                f'<p><a href="{link}">Metrics</a> <a href="/healthz">healthz</a> '
                f'<a href="/readyz">readyz</a></p></body></html>\n'
            )
            self._send(200, html.encode(), {"Content-Type": "text/html; charset=utf-8"})
        else:
            self._send(404, b"not found\n")

    do_HEAD = do_GET

    def _admitted(self, srv: WebServer) -> bool:
        """The rate limit and basic auth; False once the refusal is answered (or the connection is gone)."""
        limiter = srv.limiter
        if limiter is not None and not limiter.allow():
            srv.stats.rate_limited += 1
            self._send(429, b"too many requests\n", _BUSY_AUTH)
            return False
        auth = srv.auth
        if not auth:
            return True
        conn = srv.conn_of(self.request)
        verdict = auth.check(
            self.headers.get("Authorization"),
            conn.set_job if conn is not None else None,
            srv.limits.read_timeout,
            conn is not None and conn.refused,
        )
        if verdict is Verdict.OK:
            return True
        if verdict is Verdict.BUSY:
            srv.stats.auth_busy += 1
            self._send(429, b"too many password checks; try again\n", _BUSY_AUTH)
        elif verdict is Verdict.GONE:
            self.close_connection = True  # closed to make room while its check waited
        else:
            srv.stats.auth_failures += 1
            self._send(401, b"unauthorized\n", {"WWW-Authenticate": 'Basic realm="gpu-exporter"'})
        return False

    def _peer_cert(self) -> bool:
        """Whether the client presented a certificate (verified in the handshake against client_ca_file)."""
        getpeercert = getattr(self.connection, "getpeercert", None)
        return bool(getpeercert is not None and getpeercert())

    def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        conn = self.server.conn_of(self.request)
        if conn is not None:
            conn.refused = code in (401, 403, 429)
        self.send_response(code)
        for key, value in self.server.extra_headers:
            self.send_header(key, value)
        sent = dict(headers or {})
        sent.setdefault("Content-Type", "text/plain; charset=utf-8")
        for key, value in sent.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s %s", self.address_string(), format % args)


class Stats:
    def __init__(self) -> None:
        self.accepted = 0
        self.rejected = 0  # cap reached, every slot busy: 503
        self.evicted = 0  # closed to make room for a newcomer
        self.timeouts = 0  # request not in within the read timeout, or idle past the idle timeout
        self.tls_failures = 0
        self.auth_failures = 0
        self.auth_busy = 0  # a password check found the pool's queue full: 429
        self.auth_evicted = 0  # closed to make room while its password check waited
        self.rate_limited = 0  # refused by rate_limit: 429


class WebServer(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    block_on_close = False  # no list of threads kept: the connection table bounds them

    def __init__(
        self,
        address: str | Sequence[str],
        site: Site,
        web: WebConfig | None = None,
        limits: Limits | None = None,
        sockets: Sequence[socket.socket] = (),
    ) -> None:
        """Serve on ``sockets`` (listening already), else on each of ``address``; ListenError (an OSError)
        when one cannot be listened on."""
        self.listeners = list(sockets) or bind_all([address] if isinstance(address, str) else address)
        for sock in self.listeners:
            sock.setblocking(False)  # one thread accepts on all: a connection gone before accept() never blocks it
        self.address_family = self.listeners[0].family
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self.site = site
        self.limits = limits or Limits()
        self.stats = Stats()
        self._conns: dict[int, _Conn] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.auth_state = AuthState()  # remembered checks and the check pool outlive reloads
        self.limiter: RateLimiter | None = None
        self.set_web(web or WebConfig())
        super().__init__(self.listeners[0].getsockname(), _Handler, bind_and_activate=False)
        self.socket.close()  # the one socketserver made unbound: the listeners are served instead
        self.socket = self.listeners[0]
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = str(self.server_address[0]), self.port

    def set_web(self, web: WebConfig) -> None:
        """Serve with this TLS, auth, headers and rate limit from now on (open connections keep theirs)."""
        tls = web.tls_state()
        limiter = self.limiter
        if limiter is None or (limiter.interval, limiter.burst) != (web.rate_interval, web.rate_burst):
            limiter = web.limiter()  # a new bucket only when the setting changed
        self.web, self.tls, self.extra_headers = web, tls, web.headers
        self.auth = BasicAuth(web.users, self.auth_state)
        self.limiter = limiter

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def addresses(self) -> list[str]:
        """Where it listens: ``127.0.0.1:9400``, ``[::1]:9400``, one per socket."""
        return [describe(sock) for sock in self.listeners]

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    # --- connection table ---
    def conn_of(self, sock: Any) -> _Conn | None:
        return self._conns.get(id(sock))

    def process_request(self, request: Any, client_address: Any) -> None:
        now = time.monotonic()
        with self._lock:
            refuse = False
            if len(self._conns) >= self.limits.max_connections:
                victim = self._victim()
                if victim is not None:  # make room
                    victim.waiting = False
                    job, victim.job = victim.job, None
                    if job is not None:
                        job.cancel()
                        self.stats.auth_evicted += 1
                    victim.kill()
                    self._conns.pop(id(victim.sock), None)
                    self.stats.evicted += 1
                else:  # every slot is answering a request (or checking its password right now)
                    refuse = True
                    self.stats.rejected += 1
            if not refuse:
                self._conns[id(request)] = _Conn(request, now + self.limits.read_timeout, now)
                self.stats.accepted += 1
        if refuse:
            self._refuse(request)  # outside the lock: shutdown_request takes it
            return
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address), daemon=True)
        thread.start()

    def _victim(self) -> _Conn | None:
        """The connection to close for a newcomer (under the lock): of those waiting for a request, one
        whose last answer refused it, else the one waiting longest; else, of those whose password check
        waits in the pool, the one that ranks lowest. A flood's connections go before a scraper's new one
        (whose request may simply not be read yet on a busy machine)."""
        waiting = [c for c in self._conns.values() if c.waiting]
        if waiting:
            return min(waiting, key=lambda c: (not c.refused, c.since))
        queued = [c for c in self._conns.values() if c.job is not None and c.job.pending]
        if queued:
            return max(queued, key=lambda c: c.job.order if c.job is not None else (0, 0.0, 0))
        return None

    def _refuse(self, request: socket.socket) -> None:
        try:
            request.setblocking(False)
            if self.tls is None:
                request.send(_BUSY)
        except OSError:
            pass
        self.shutdown_request(request)

    def finish_request(self, request: Any, client_address: Any) -> None:
        tls = self.tls
        if tls is None:
            self.RequestHandlerClass(request, client_address, self)  # type: ignore[arg-type]
            return
        request.settimeout(self.limits.read_timeout)
        try:
            wrapped = tls.context().wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        except (OSError, ssl.SSLError):
            self.stats.tls_failures += 1
            return
        with self._lock:
            conn = self._conns.pop(id(request), None)
            if conn is not None:
                conn.sock = wrapped
                self._conns[id(wrapped)] = conn
        try:
            wrapped.do_handshake()
            if not tls.files.allows(wrapped.getpeercert()):
                self.stats.tls_failures += 1
                log.debug("http: the client certificate of %s carries none of client_allowed_sans", client_address)
                return
            self.RequestHandlerClass(wrapped, client_address, self)  # type: ignore[arg-type]
        except (OSError, ssl.SSLError) as exc:
            if isinstance(exc, (ssl.SSLError, TimeoutError)):
                self.stats.tls_failures += 1
            log.debug("http: TLS connection from %s failed: %s", client_address, exc)
        finally:
            with self._lock:
                self._conns.pop(id(wrapped), None)
            try:
                wrapped.close()
            except OSError:
                pass

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._conns.pop(id(request), None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """On the server thread between accepts (every 0.5 s): close connections past their deadline (a
        request not read in time, an idle keep-alive, an answer the client does not take)."""
        now = time.monotonic()
        with self._lock:
            late = [c for c in self._conns.values() if c.deadline < now]
            for conn in late:
                conn.waiting = False
                conn.kill()
            self.stats.timeouts += len(late)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request is its own business: one debug line, no traceback."""
        log.debug("http: request from %s failed: %s", client_address, sys.exc_info()[1])

    # --- accepting ---
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept on every listener from this one thread; the sweep (``service_actions``) between."""
        self._stopped.clear()
        try:
            with selectors.DefaultSelector() as selector:
                for sock in self.listeners:
                    selector.register(sock, selectors.EVENT_READ)
                while not self._stopping.is_set():
                    for key, _ in selector.select(poll_interval):
                        self._accept(key.fileobj)  # type: ignore[arg-type]
                    self.service_actions()
        finally:
            self._stopped.set()

    def _accept(self, listener: socket.socket) -> None:
        try:
            request, client_address = listener.accept()
        except BlockingIOError:  # gone before it was taken
            return
        except OSError as exc:  # out of file descriptors: the connection waits in the backlog
            log.debug("http: accept failed: %s", exc)
            self._stopping.wait(0.05)  # not a busy loop while the listener stays readable
            return
        request.setblocking(True)
        try:
            self.process_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def shutdown(self) -> None:
        """Stop serve_forever and wait for it (5 s at most)."""
        self._stopping.set()
        self._stopped.wait(5.0)

    def server_close(self) -> None:
        for sock in self.listeners:
            sock.close()

    # --- lifecycle ---
    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=5.0)
            self._thread = None
        self.server_close()
        self.auth_state.pool.stop()
        with self._lock:
            for conn in self._conns.values():
                conn.kill()

    def connections(self) -> int:
        return len(self._conns)
