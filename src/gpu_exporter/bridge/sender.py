"""Remote-write sender: HTTP POST with timeouts, retry with backoff, and receivers' refusals.

What is retried and what is not (remote write 1.0, and Prometheus 2.42 as it behaves):

* 2xx: written.
* 5xx and network errors: retried with exponential backoff until they succeed or the bridge stops;
  the MQTT messages stay unacknowledged meanwhile, so nothing is lost and the broker holds the rest.
* 429: retried like a 5xx, honouring ``Retry-After`` (seconds or an HTTP date), within the backoff cap.
* Refusals of the samples themselves ("too old sample", "out of bounds", "out of order sample",
  "duplicate sample for timestamp"): never retried as they are. Prometheus fails the whole request for
  one bad sample, and 2.42 answers "too old sample" with a 500, so the body decides, not the status.
  The request is halved along time and the halves are sent again, so that only the refused samples are
  dropped (and counted); for the time-ordered refusals a refused newer half condemns the older half
  too, which keeps the number of requests logarithmic.
* Any other 4xx: dropped and counted, not retried (the remote-write spec's rule).
"""

from __future__ import annotations

import base64
import datetime
import email.utils
import http.client
import logging
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from gpu_exporter.bridge.metrics import BridgeMetrics
from gpu_exporter.bridge.remote_write import (
    HEADERS,
    Series,
    WriteEncoder,
    compress,
    split_by_samples,
    split_by_time,
)

__all__ = ["RemoteWriter", "Stopped", "WriteOutcome", "classify"]

log = logging.getLogger(__name__)

USER_AGENT = "gpu-exporter-bridge/0.1"

# Refusal reasons found in the response body, and whether they are ordered in time (a refused newer
# sample implies the older ones would be refused too).
# Prometheus: "too old sample", "out of bounds", "out of order sample", "duplicate sample for timestamp";
# Mimir: "...timestamp is too old (err-mimir-sample-timestamp-too-old)", "...(err-mimir-sample-out-of-order)",
# "...(err-mimir-sample-duplicate-timestamp)". Matched on the lower-cased body with "-" read as " ".
_REFUSALS = (
    ("too old", "too_old", True),
    ("out of bounds", "too_old", True),
    ("out of order", "out_of_order", True),
    ("duplicate sample", "duplicate", False),
    ("duplicate timestamp", "duplicate", False),
)


class Stopped(Exception):
    """The bridge stopped while a write was still failing; nothing of it may be acknowledged."""


@dataclass
class WriteOutcome:
    written: int = 0  # samples the receiver accepted
    rejected: int = 0  # samples refused for good and dropped
    requests: int = 0


@dataclass(frozen=True)
class _Verdict:
    action: str  # "ok", "retry", "refuse"
    reason: str = ""
    ordered: bool = False  # refusal ordered in time
    bisect: bool = False  # worth halving the request


def classify(status: int, body: bytes) -> _Verdict:
    """What to do with a remote-write answer."""
    if 200 <= status < 300:
        return _Verdict("ok")
    text = body[:4096].decode("utf-8", "replace").lower().replace("-", " ")
    for needle, reason, ordered in _REFUSALS:
        if needle in text and (400 <= status < 600):
            return _Verdict("refuse", reason, ordered, bisect=True)
    if status == 429 or status >= 500:
        return _Verdict("retry", "throttled" if status == 429 else "server")
    return _Verdict("refuse", "client_error")


class RemoteWriter:
    """Writes series to one remote-write URL over a kept-alive HTTP connection. One thread only."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        username: str = "",
        password: str = "",
        bearer_token: str = "",
        ca_file: str = "",
        cert_file: str = "",
        key_file: str = "",
        insecure_skip_verify: bool = False,
        headers: dict[str, str] | None = None,
        max_samples: int = 5000,
        backoff_min: float = 0.1,
        backoff_max: float = 10.0,
        metrics: BridgeMetrics | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"invalid remote-write URL {url!r} (use http:// or https://)")
        if username and bearer_token:
            raise ValueError("use either basic auth or a bearer token, not both")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._timeout = timeout
        self._headers = {"User-Agent": USER_AGENT, **(headers or {}), **HEADERS}
        if username:
            token = base64.b64encode(f"{username}:{password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        elif bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token}"
        self._ssl: ssl.SSLContext | None = None
        if self._https:
            ctx = ssl.create_default_context(cafile=ca_file or None)
            if cert_file:
                ctx.load_cert_chain(cert_file, key_file or None)
            if insecure_skip_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl = ctx
        self._max_samples = max_samples
        self._backoff_min = backoff_min
        self._backoff_max = backoff_max
        self._metrics = metrics
        self._stop = stop or threading.Event()
        self._encoder = WriteEncoder()
        self._conn: http.client.HTTPConnection | None = None
        self._logged: set[str] = set()
        self._failing_since: float | None = None  # monotonic: the first failure since the last answer taken
        self.last_failure = ""

    def failing_for(self) -> float | None:
        """Seconds writes have been failing (retried, or refused as a client error such as 401), or None
        while the last write went through. Read by other threads."""
        since = self._failing_since
        return None if since is None else time.monotonic() - since

    def _failing(self, why: str) -> None:
        self.last_failure = why
        if self._failing_since is None:
            self._failing_since = time.monotonic()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def write(self, series: Sequence[Series]) -> WriteOutcome:
        """Write ``series``; returns once every sample is written or refused for good.

        Raises Stopped when the bridge is stopping and a retryable failure is still unresolved.
        """
        outcome = WriteOutcome()
        for request in split_by_samples(series, self._max_samples):
            self._write_bisecting(request, outcome)
        return outcome

    def _write_bisecting(self, request: list[Series], outcome: WriteOutcome) -> None:
        verdict = self._post(request, outcome)
        n = sum(map(len, [s.timestamps for s in request]))
        if verdict.action == "ok":
            outcome.written += n
            return
        halves = split_by_time(request) if verdict.bisect else None
        if halves is None:
            self._refused(verdict.reason, n, outcome)
            return
        older, newer = halves
        newer_rejected_before = outcome.rejected
        self._write_bisecting(newer, outcome)
        newer_all_refused = outcome.rejected - newer_rejected_before == sum(len(s) for s in newer)
        if verdict.ordered and newer_all_refused:
            self._refused(verdict.reason, sum(len(s) for s in older), outcome)
        else:
            self._write_bisecting(older, outcome)

    def _refused(self, reason: str, n: int, outcome: WriteOutcome) -> None:
        outcome.rejected += n
        if self._metrics is not None:
            self._metrics.samples_rejected.labels(reason).inc(n)
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "remote storage refused %d samples (%s); dropping them. This is logged once per "
                "reason; see gpu_exporter_bridge_samples_rejected_total",
                n,
                reason.replace("_", " "),
            )

    def _post(self, request: list[Series], outcome: WriteOutcome) -> _Verdict:
        body = compress(self._encoder.encode(request))
        delay = self._backoff_min
        while True:
            if self._stop.is_set():
                raise Stopped("stopping with an unwritten request")
            outcome.requests += 1
            status, answer, retry_after = self._round_trip(body)
            if self._metrics is not None:
                self._metrics.requests.labels(str(status)).inc()
            verdict = classify(status, answer) if status else _Verdict("retry", "network")
            if verdict.reason == "client_error":  # every write refused (401, a redirect): nothing gets in
                self._failing(f"HTTP {status}, refused")
            elif verdict.action != "retry":  # an answer the bridge goes on with
                self._failing_since = None
            if verdict.action != "retry":
                if verdict.action == "refuse" and not verdict.bisect:
                    log.warning(
                        "remote write to %s answered %d: %s",
                        self.url,
                        status,
                        answer[:200].decode("utf-8", "replace").strip(),
                    )
                return verdict
            if self._metrics is not None:
                self._metrics.write_errors.labels(verdict.reason).inc()
            wait = max(delay, retry_after or 0.0)
            wait = min(wait, self._backoff_max) * random.uniform(0.8, 1.0)
            what = f"HTTP {status}" if status else answer.decode("utf-8", "replace")
            self._failing(what)
            log.warning("remote write to %s failed (%s); retrying in %.1fs", self.url, what, wait)
            if self._stop.wait(wait):
                raise Stopped("stopping with an unwritten request")
            delay = min(delay * 2, self._backoff_max)

    def _round_trip(self, body: bytes) -> tuple[int, bytes, float | None]:
        """One POST: (status, body, Retry-After seconds); status 0 and the error text on failure."""
        started = time.monotonic()
        try:
            if self._conn is None:
                if self._https:
                    self._conn = http.client.HTTPSConnection(
                        self._host, self._port, timeout=self._timeout, context=self._ssl
                    )
                else:
                    self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            self._conn.request("POST", self._path, body=body, headers=self._headers)
            resp = self._conn.getresponse()
            answer = resp.read()
            retry_after = _retry_after(resp.getheader("Retry-After"))
            if resp.getheader("Connection", "").lower() == "close":
                self.close()
            return resp.status, answer, retry_after
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return 0, str(exc).encode() or type(exc).__name__.encode(), None
        finally:
            if self._metrics is not None:
                self._metrics.write_duration.observe(time.monotonic() - started)


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header: delay-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an obsolete date form without a zone: HTTP dates are GMT
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - time.time())
