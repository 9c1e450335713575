"""The Prometheus page: rendered at most once per sample, by the first scrape after it, and served as
stored bytes (gzip-compressed once, when a client first asks for gzip).

A scrape never calls a vendor library: it renders the newest sample at most once, and every further
scrape of that sample copies a reference under a lock and writes bytes (a stale sampler's page is the
agent's own metrics alone, made at most once a second). Device metrics are rendered by a catalog-driven renderer through a ``View`` (which names
and scales each catalog key); the agent's own metrics come from a prometheus_client registry whose
collectors build families fresh from live state.
"""

from __future__ import annotations

import gzip
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpu_exporter import __version__, catalog, hostread, openmetrics
from gpu_exporter.backends.base import Backend
from gpu_exporter.buildinfo import build_info_family
from gpu_exporter.catalog import name_filter
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.ring import RingBuffer
from gpu_exporter.sampler import Sampler
from gpu_exporter.selfmetrics import Served
from gpu_exporter.web.server import Limits, Site, WebServer, parse_listen
from gpu_exporter.web.webconfig import WebConfig

__all__ = [
    "AgentCollector",
    "Exposition",
    "MetricsServer",
    "Split",
    "View",
    "ViewFamily",
    "ViewSeries",
    "native_view",
    "parse_listen",
    "render",
]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PREFIXES_MAX = 200_000  # series lines a view remembers (one node serves a few thousand)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _pairs(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{escape(v)}"' for k, v in pairs)


def fmt(value: float) -> str:
    if value != value:  # NaN never comes from a backend, but render it validly if it does
        return "NaN"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


@dataclass(frozen=True, slots=True)
class ViewSeries:
    key: str  # catalog key
    const: str  # pre-rendered constant labels, with a leading comma, or ""
    dynamic: tuple[str, ...]  # names of the dynamic labels, in the order the backend gives values
    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class ViewFamily:
    name: str
    type: str
    help: str
    series: tuple[ViewSeries, ...]

    @property
    def header(self) -> str:
        return f"# HELP {self.name} {_help(self.help)}\n# TYPE {self.name} {self.type}\n"


@dataclass(frozen=True, slots=True)
class Split:
    """One copy of a device's series (a view that splits a shared GPU by pod): its labels, values that
    replace the device's for this copy, and the only keys it carries (None: every key)."""

    labels: str
    values: Mapping[str, float] = field(default_factory=dict)
    only: frozenset[str] | None = None


@dataclass(frozen=True)
class View:
    """How device readings become series: family names, units, labels."""

    families: tuple[ViewFamily, ...]
    up: ViewFamily | None
    info: ViewFamily | None
    device_labels: Callable[[DeviceId, dict[str, str]], str]
    info_labels: Callable[[DeviceId, dict[str, str]], str]
    # copies of a device's series, one per pod sharing it (--k8s.virtual-gpus); None or []: one series
    splits: Callable[[DeviceSample], Sequence[Split]] | None = None
    # (device labels, family, constant labels, dynamic label values) -> the line up to its value: the
    # same series are rendered for every page, so each line's name and labels are escaped and joined once
    prefixes: dict[tuple[str, str, str, tuple[str, ...]], str] = field(default_factory=dict, compare=False, repr=False)


def _native_device_labels(device: DeviceId, info: dict[str, str]) -> str:
    return _pairs(device.labels())


_INFO_ORDER = ("name", "serial", "pci_bus_id", "device", "driver_version", "cuda_version", "vendor")


def _native_info_labels(device: DeviceId, info: dict[str, str]) -> str:
    keys = [k for k in _INFO_ORDER if k in info] + sorted(k for k in info if k not in _INFO_ORDER)
    return _pairs([*device.labels(), *((k, info[k]) for k in keys)])


def native_view(include: str = "", exclude: str = "", enabled: Callable[[str], bool] = lambda g: True) -> View:
    """Our own names and base units (the default, ``--metrics.naming=native``)."""
    keep = name_filter(include, exclude)
    families = []
    for fam in catalog.families([m for m in catalog.CATALOG if enabled(m.group)]):
        if not keep(fam.name):
            continue
        series = tuple(
            ViewSeries(m.key, "".join(f',{k}="{escape(v)}"' for k, v in m.const_labels), m.labels) for m in fam.metrics
        )
        families.append(ViewFamily(fam.name, fam.type, fam.help, series))
    up, info = (ViewFamily(f.name, f.type, f.help, ()) for f in (catalog.UP, catalog.INFO))
    return View(
        tuple(families),
        up if keep(up.name) else None,
        info if keep(info.name) else None,
        _native_device_labels,
        _native_info_labels,
    )


def render(sample: Sample, view: View) -> str:
    """Prometheus text for the device metrics of one sample."""
    cache: dict[DeviceId, str] = {}
    rows: list[tuple[str, dict[str, list[tuple[tuple[str, ...], float]]]]] = []
    out: list[str] = []
    up_lines: list[str] = []
    info_lines: list[str] = []
    for ds in sample.devices:
        labels = cache.get(ds.device)
        if labels is None:
            labels = cache[ds.device] = view.device_labels(ds.device, ds.info)
        if view.up is not None:
            up_lines.append(f"{view.up.name}{{{labels}}} {1 if ds.up else 0}\n")
        if view.info is not None and ds.info:
            info_lines.append(f"{view.info.name}{{{view.info_labels(ds.device, ds.info)}}} 1\n")
        if not ds.up:
            continue
        grouped: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        for (key, dynamic), value in ds.values.items():
            grouped.setdefault(key, []).append((dynamic, value))
        splits = view.splits(ds) if view.splits is not None else ()
        if not splits:
            rows.append((labels, grouped))
        for split in splits:
            copy = {k: v for k, v in grouped.items() if split.only is None or k in split.only}
            copy.update({k: [((), v)] for k, v in split.values.items() if k in copy})
            rows.append((split.labels, copy))
    if up_lines and view.up is not None:
        out.append(view.up.header)
        out.extend(up_lines)
    if info_lines and view.info is not None:
        out.append(view.info.header)
        out.extend(info_lines)
    prefixes = view.prefixes
    if len(prefixes) > _PREFIXES_MAX:  # devices, pods or label values that came and went: start afresh
        prefixes.clear()
    for fam in view.families:
        lines: list[str] = []
        name = fam.name
        for labels, grouped in rows:
            for series in fam.series:
                entries = grouped.get(series.key)
                if not entries:
                    continue
                for dynamic, value in entries:
                    where = (labels, name, series.const, dynamic)
                    prefix = prefixes.get(where)
                    if prefix is None:
                        extra = "".join(f',{n}="{escape(v)}"' for n, v in zip(series.dynamic, dynamic, strict=False))
                        prefix = prefixes[where] = f"{name}{{{labels}{series.const}{extra}}} "
                    lines.append(f"{prefix}{fmt(value * series.scale)}\n")
        if lines:
            out.append(fam.header)
            out.extend(lines)
    return "".join(out)


class AgentCollector:
    """The agent's own metrics, read from live state at render time."""

    def __init__(self, sampler: Sampler, ring: RingBuffer, backends: Sequence[Backend]) -> None:
        self.sampler = sampler
        self.ring = ring
        self.backends = backends

    def collect(self) -> Iterator[Metric]:
        s = self.sampler
        yield build_info_family("gpu_exporter_build_info", "agent")
        yield GaugeMetricFamily(
            "gpu_exporter_collect_duration_seconds",
            "Seconds the last collect cycle spent reading the GPUs.",
            value=s.last_duration,
        )
        yield CounterMetricFamily(
            "gpu_exporter_collect_seconds", "Seconds spent reading the GPUs.", value=s.collect_seconds_total
        )
        yield CounterMetricFamily("gpu_exporter_collects", "Collect cycles run.", value=s.collects)
        yield CounterMetricFamily(
            "gpu_exporter_collect_overruns",
            "Collect ticks skipped because a cycle took longer than the interval.",
            value=s.overruns,
        )
        errors = CounterMetricFamily(
            "gpu_exporter_collect_errors",
            "Failed vendor-library calls, by backend and call.",
            labels=["backend", "call"],
        )
        for backend in self.backends:
            for call, count in sorted(backend.errors.items()):
                errors.add_metric([backend.name, call], count)
        if s.failures:
            errors.add_metric(["sampler", "read"], s.failures)
        yield errors
        yield GaugeMetricFamily(
            "gpu_exporter_last_collect_success_timestamp_seconds",
            "Unix time of the last collect cycle in which every backend read.",
            value=s.last_success,
        )
        yield GaugeMetricFamily(
            "gpu_exporter_sampler_stale",
            "1 while no backend has read for 3 intervals (10 s at least): the sampler is stuck or failing, "
            "and the page holds no GPU series.",
            value=1 if s.stale() else 0,
        )
        host = CounterMetricFamily(
            "gpu_exporter_host_read_failures",
            "Host file reads (sysfs, procfs) refused: not_regular (a FIFO or device), too_large (over the "
            "cap), timeout (no answer in time), stuck (an earlier read of the file has not returned), busy "
            "(too many reads stuck).",
            labels=["reason"],
        )
        for reason, count in hostread.failures().items():
            host.add_metric([reason], count)
        yield host
        yield GaugeMetricFamily(
            "gpu_exporter_host_reads_stuck",
            "Host files whose read has not returned; each holds one reader thread.",
            value=hostread.stuck(),
        )
        healthy = GaugeMetricFamily(
            "gpu_exporter_backend_healthy",
            "1 while the backend has at least one answering device.",
            labels=["backend"],
        )
        for backend in self.backends:
            healthy.add_metric([backend.name], 1 if backend.healthy() else 0)
        yield healthy
        yield from s.bounds.collect()  # labels limited, values not finite, counters gone backwards
        yield GaugeMetricFamily("gpu_exporter_ring_samples", "Samples held in the ring buffer.", value=len(self.ring))
        yield GaugeMetricFamily(
            "gpu_exporter_ring_capacity", "Samples the ring buffer can hold.", value=self.ring.capacity
        )
        yield CounterMetricFamily(
            "gpu_exporter_ring_overwritten",
            "Samples overwritten in the ring buffer because it was full.",
            value=self.ring.overwritten,
        )


Section = Callable[[], str]


class _Page:
    """One sample's page: the text made once, its gzip and OpenMetrics forms once a client asks for them."""

    __slots__ = ("_gzip", "_om", "plain")

    def __init__(self, plain: bytes) -> None:
        self.plain = plain
        self._gzip: bytes | None = None
        self._om: tuple[bytes, bytes] | None = None

    def gzip(self) -> bytes:
        if self._gzip is None:
            self._gzip = gzip.compress(self.plain, compresslevel=6, mtime=0)
        return self._gzip

    def openmetrics(self) -> tuple[bytes, bytes]:
        if self._om is None:
            self._om = _openmetrics(self.plain)
        return self._om


class Exposition:
    """Holds the current page; ``update`` is the sampler's listener.

    The page of a sample is made by the first scrape that comes after it (once, however many scrapes
    follow; a second scrape meanwhile waits for the first one's page), not by the sampler: at a 100 ms
    interval and a 15 s scrape interval the sampler would otherwise render, and compress, 150 pages for
    each one served. A scrape still never calls a vendor library: it renders the newest sample.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        view: View,
        sections: Sequence[Section] = (),
        stale: Callable[[], bool] | None = None,
    ) -> None:
        self.registry = registry
        self._served = Served(registry)  # without the _created series (selfmetrics.Served says why)
        self.view = view
        self.sections = list(sections)
        self.stale = stale  # the sampler's stale(): while True, serve the agent's own metrics alone
        self._stale_lock = threading.Lock()
        self._stale_page: tuple[float, bytes, bytes] | None = None  # (monotonic made, plain, gzip)
        self._lock = threading.Lock()  # the newest sample and its page, when made
        self._make_lock = threading.Lock()  # one scrape makes a page; the others wait for it
        self.last_sample: Sample | None = None
        self._made: _Page | None = None  # the page of last_sample, once a scrape has asked for it
        self._good = _Page(b"")  # the last page made (served again when making a page fails)

    def update(self, sample: Sample) -> None:
        with self._lock:
            self.last_sample, self._made = sample, None

    def _make(self, sample: Sample) -> bytes:
        parts = [render(sample, self.view)]
        for section in self.sections:
            try:
                parts.append(section())
            except Exception:
                log.exception("a metrics section failed to render")
        parts.append(generate_latest(self._served).decode("utf-8"))
        return "".join(parts).encode("utf-8")

    def _current(self) -> _Page:
        """The newest sample's page, made now if no scrape has asked for it yet."""
        with self._lock:
            made = self._made
        if made is not None:
            return made
        with self._make_lock:
            with self._lock:
                made, sample = self._made, self.last_sample
            if made is not None:
                return made
            if sample is None:
                return self._good
            try:
                made = _Page(self._make(sample))
            except Exception:  # a bug: the last page made goes on being served, and the log says why
                log.exception("rendering the page failed; the previous page is served")
                return self._good
            with self._lock:
                if self.last_sample is sample:
                    self._made = made
            self._good = made
            return made

    def page(self, accept_gzip: bool) -> bytes:
        if self.stale is not None and self.stale():
            plain, packed = self._stale()
            return packed if accept_gzip else plain
        page = self._current()
        if not accept_gzip:
            return page.plain
        with self._make_lock:
            return page.gzip()

    def _stale(self) -> tuple[bytes, bytes]:
        """The page of a stale sampler: no GPU series (its values are old; absent, Prometheus marks them
        stale), the agent's own metrics as they are now. Made at most once a second, by one scrape."""
        with self._stale_lock:
            made = self._stale_page
            now = time.monotonic()
            if made is None or now - made[0] >= 1.0:
                plain = generate_latest(self.registry)
                made = self._stale_page = (now, plain, gzip.compress(plain, compresslevel=6, mtime=0))
            return made[1], made[2]

    def openmetrics_page(self, accept_gzip: bool) -> bytes:
        """The page in OpenMetrics, made from the text page once per sample, when a client asks."""
        if self.stale is not None and self.stale():
            text = _openmetrics(self._stale()[0])
            return text[1] if accept_gzip else text[0]
        page = self._current()
        with self._make_lock:
            om = page.openmetrics()
        return om[1] if accept_gzip else om[0]

    def negotiate(self, accept: str | None) -> tuple[Callable[[bool], bytes], str]:
        """The server's hook (web/server.py ``Site.negotiate``): OpenMetrics when the client prefers it."""
        if openmetrics.accepts_openmetrics(accept):
            return self.openmetrics_page, openmetrics.CONTENT_TYPE
        return self.page, CONTENT_TYPE


def _openmetrics(plain: bytes) -> tuple[bytes, bytes]:
    text = openmetrics.convert(plain.decode("utf-8")).encode("utf-8")
    return text, gzip.compress(text, compresslevel=6, mtime=0)


ReadyCheck = Callable[[], tuple[bool, str]]


class MetricsServer(WebServer):
    """The agent's endpoint (``web/server.py``). Raises OSError (e.g. address in use) when created."""

    def __init__(
        self,
        address: str | Sequence[str],
        telemetry_path: str,
        exposition: Exposition,
        ready: ReadyCheck,
        web: WebConfig | None = None,
        limits: Limits | None = None,
        sockets: Sequence[socket.socket] = (),
    ) -> None:
        site = Site(
            telemetry_path,
            exposition.page,
            ready,
            title=f"gpu-exporter {__version__}",
            content_type=CONTENT_TYPE,
            negotiate=exposition.negotiate,
        )
        super().__init__(address, site, web, limits, sockets)
