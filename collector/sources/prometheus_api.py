"""Reading series from a Prometheus-compatible HTTP API (Prometheus, Thanos, Mimir) into the store.

:class:`PromApi` is the HTTP side (``/api/v1/series`` and ``/api/v1/query_range``, as POST
forms); :func:`backfill` reads a past range into a sink; :class:`Follower` reads the newest range
on every poll (the sidecar's follow mode). Rows are built by :mod:`collector.formats.prom_matrix`,
i.e. by the scrape mappers.

Rules:

1. Requests: ``POST <url>/api/v1/<endpoint>`` with a form body; ``Authorization: Bearer <token>``
   or HTTP basic when given, and any extra headers (Mimir's ``X-Scope-OrgID``). ``https`` verifies
   the server's certificate (against ``ca_file`` when given, else the system's store) unless
   ``tls_verify`` is false. A body is refused past ``max_body_bytes``; ``gzip`` is accepted.
2. Any failure — no connection, a timeout, an HTTP status other than 200, a body that is not
   JSON, ``"status": "error"``, a result that is not a matrix — is one :class:`PrometheusError`
   naming the URL, the query and what was wrong.
3. Plan: for each distinct selector the series of the range are listed first
   (``/api/v1/series``) and counted per metric name; names no scrape mapper stores are not
   queried (:func:`collector.formats.prom_matrix.maps`). Names are packed into queries
   ``{__name__=~"a|b|…", <the selector's matchers>}`` (one name: ``__name__="a"``).
4. Windows: the range is cut at step-aligned times (multiples of ``step``) into windows of at
   most :data:`MAX_POINTS` points per series (Prometheus refuses more than 11,000) and at most
   ``max_samples`` points of all series together; inside a window the names are packed so that
   no request exceeds ``max_samples`` points either. A window's answers, and so a read's
   memory, are bounded whatever the range; windows go in time order.
5. Writes: a window's rows go to the sink in one write per table once all its requests have
   answered (each window is newer than the last, which is the store's cheap case), engine
   counters with their per-second rate (:class:`collector.rates.CounterRates`, one per source,
   as the sidecar does). Where a window holds whole time slices of the store
   (:data:`collector.series.SLICE_NS`: the step divides an hour and ``max_samples`` allows an
   hour of every series), windows are cut at slice edges, and a backfill writes them with
   ``write_closed`` when the sink has it: the store packs each slice as it writes it instead
   of appending it and packing it again at its close. A failure stops the read with
   :class:`PrometheusError`; every window written before it stays, and :class:`Progress` says
   up to when (``done_until_ns``).
6. Refused samples (the mappers' problems) are counted; the first :data:`MAX_ERRORS` of a read
   are written to ``ingest_errors`` with the source ``prometheus <url>``.
7. Each source seen gets a ``targets`` row (kind ``prometheus``, host from the host label),
   which is how the analyzer places an inferred deployment's engines on their GPUs' hosts.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import msgspec

from collector.errors import Problem
from collector.formats import Parsed
from collector.formats.prom_matrix import DROP_LABELS, maps, parse_matrix, source_of
from collector.rates import CounterRates
from collector.records import batch
from collector.series import SLICE_NS
from collector.sink import Sink
from ioeconf.promql import DEFAULT_SELECTORS, matchers

if TYPE_CHECKING:
    from ioeconf.settings import PrometheusSourceSpec

log = logging.getLogger(__name__)

MAX_POINTS = 10_000  # per series per request; Prometheus refuses a range of more than 11,000 steps
MAX_SAMPLES = 250_000  # per request: bounds one answer's JSON (~8 MB) and its objects
MAX_ERRORS = 100
NS = 1_000_000_000


class PrometheusError(RuntimeError):
    """A request to the Prometheus API that gave no usable answer (rule 2)."""


@dataclass(frozen=True)
class Endpoint:
    """Where and how to ask (rule 1)."""

    url: str  # base URL, the path before /api/v1 (``http://prom:9090``, ``http://mimir/prometheus``)
    timeout_s: float = 30.0
    bearer_token: str = ""
    basic_user: str = ""
    basic_password: str = ""
    ca_file: str = ""
    tls_verify: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    max_body_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True)
class Mapping:
    """How series become rows (:mod:`collector.formats.prom_matrix` rules 1-2)."""

    selectors: tuple[str, ...] = DEFAULT_SELECTORS
    step_s: float = 15.0
    drop_labels: tuple[str, ...] = DROP_LABELS
    source_label: str = "instance"
    host_label: str = "host"
    host: str = ""
    prefix: str = ""
    max_samples: int = MAX_SAMPLES


@dataclass
class Progress:
    """What a read did: rows per table, requests, refused samples, and the newest time written."""

    rows: dict[str, int] = field(default_factory=dict)
    requests: int = 0
    pieces: int = 0
    series: int = 0
    problems: int = 0
    done_until_ns: int = 0
    sources: dict[str, str] = field(default_factory=dict)  # source -> host (rule 7)


class PromApi:
    """Rule 1-2: form POSTs to one Prometheus-compatible API, answers as parsed JSON."""

    def __init__(self, endpoint: Endpoint, *, opener: Callable[..., Any] | None = None):
        self.endpoint = endpoint
        self.base = endpoint.url.rstrip("/")
        self.requests = 0
        self._context = _tls_context(endpoint)
        self._open = opener or urllib.request.urlopen

    def series(self, selector: str, start_ns: int, end_ns: int) -> list[dict[str, str]]:
        data = self._post("series", [("match[]", selector), ("start", _sec(start_ns)), ("end", _sec(end_ns))])
        if not isinstance(data, list):
            raise PrometheusError(f"{self._url('series')}: answer for {selector} is not a list of series")
        return data

    def query_range(self, query: str, start_ns: int, end_ns: int, step_s: float) -> list[dict[str, Any]]:
        form = [("query", query), ("start", _sec(start_ns)), ("end", _sec(end_ns)), ("step", f"{step_s:g}")]
        data = self._post("query_range", form, _matrix_json)
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
            raise PrometheusError(f"{self._url('query_range')}: {query}: expected a matrix, got {kind!r}")
        result = data.get("result") or []
        if not isinstance(result, list):
            raise PrometheusError(f"{self._url('query_range')}: {query}: result is not a list")
        return result

    def _url(self, endpoint: str) -> str:
        return f"{self.base}/api/v1/{endpoint}"

    def _post(
        self, endpoint: str, form: list[tuple[str, str]], loads: Callable[[bytes], Any] = json.loads
    ) -> Any:
        url = self._url(endpoint)
        what = f"{url} ({dict(form).get('query') or dict(form).get('match[]')})"
        request = urllib.request.Request(
            url, data=urllib.parse.urlencode(form).encode(), headers=self._headers()
        )
        self.requests += 1
        body = self._fetch(request, what)
        try:
            doc = loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise PrometheusError(f"{what}: answer is not JSON ({exc}): {body[:120]!r}") from exc
        if not isinstance(doc, dict) or doc.get("status") != "success":
            why = doc.get("error", doc) if isinstance(doc, dict) else doc
            kind = doc.get("errorType", "") if isinstance(doc, dict) else ""
            raise PrometheusError(f"{what}: Prometheus answered error {kind}: {str(why)[:300]}")
        for warning in doc.get("warnings") or []:
            log.warning("%s: Prometheus warns: %s", what, warning)
        return doc.get("data")

    def _fetch(self, request: urllib.request.Request, what: str) -> bytes:
        cap = self.endpoint.max_body_bytes
        try:
            with self._open(request, timeout=self.endpoint.timeout_s, context=self._context) as resp:
                raw = resp.read(cap + 1)
                coding = (resp.headers.get("Content-Encoding") or "").lower()
        except urllib.error.HTTPError as exc:
            detail = _error_text(exc)
            raise PrometheusError(f"{what}: HTTP {exc.code} {exc.reason}{detail}") from exc
        except urllib.error.URLError as exc:
            raise PrometheusError(f"{what}: cannot connect: {exc.reason}") from exc
        except TimeoutError as exc:
            raise PrometheusError(f"{what}: no answer within {self.endpoint.timeout_s:g} s") from exc
        except OSError as exc:
            raise PrometheusError(f"{what}: {type(exc).__name__}: {exc}") from exc
        if len(raw) > cap:
            raise PrometheusError(f"{what}: answer over {cap:,} bytes; lower max_samples or the step")
        if coding in ("gzip", "x-gzip"):
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError, zlib.error) as exc:
                raise PrometheusError(f"{what}: gzip answer does not decode: {exc}") from exc
        return raw

    def _headers(self) -> dict[str, str]:
        e = self.endpoint
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
            "Accept-Encoding": "gzip",
            "User-Agent": "ioe-backfill",
        }
        if e.bearer_token:
            headers["Authorization"] = f"Bearer {e.bearer_token}"
        elif e.basic_user:
            pair = f"{e.basic_user}:{e.basic_password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        headers.update(dict(e.headers))
        return headers


class _Series(TypedDict, total=False):
    metric: dict[str, str]
    values: list[tuple[int | float, float]]


class _Data(TypedDict, total=False):
    resultType: str
    result: list[_Series]


class _Answer(TypedDict, total=False):
    status: str
    data: _Data
    error: str
    errorType: str
    warnings: list[str]


# A range answer's values are numbers in strings ("42"). msgspec decodes them into floats as it
# reads (strict=False), ~2x cheaper than a full decode and a float() of each string afterwards;
# an answer it refuses (a value such as "+Inf" or "x", another shape) is decoded in full by json
# and keeps its strings, which the matrix parser converts (and names the bad ones) itself.
_MATRIX = msgspec.json.Decoder(_Answer, strict=False)


def _matrix_json(body: bytes) -> Any:
    try:
        return _MATRIX.decode(body)
    except msgspec.MsgspecError:
        return json.loads(body)


def _tls_context(e: Endpoint) -> ssl.SSLContext | None:
    if not e.url.startswith("https://"):
        return None
    context = ssl.create_default_context(cafile=e.ca_file or None)
    if not e.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _error_text(exc: urllib.error.HTTPError) -> str:
    """Prometheus puts the reason of a 4xx/5xx in a JSON body: ``{"error": ...}``."""
    try:
        body = exc.read(4096)
        doc = json.loads(body)
        return f": {doc.get('errorType', '')} {doc.get('error', '')}".rstrip()
    except Exception:
        return ""


def _sec(ns: int) -> str:
    """Unix seconds with millisecond precision, exact (Prometheus' resolution)."""
    ms = ns // 1_000_000
    return f"{ms // 1000}.{ms % 1000:03d}"


# -- the plan and the read -----------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """One request: a query over ``[start_ns, end_ns]`` (both evaluated) at the mapping's step."""

    query: str
    start_ns: int
    end_ns: int
    series: int


@dataclass(frozen=True)
class Window:
    """Step-aligned ``[start_ns, end_ns]`` and the requests that read every series in it (rule 4)."""

    start_ns: int
    end_ns: int
    pieces: tuple[Piece, ...]


def align_up(ns: int, step_ns: int) -> int:
    return -(-ns // step_ns) * step_ns


def plan(api: PromApi, mapping: Mapping, start_ns: int, end_ns: int) -> list[Window]:
    """Rules 3-4: the windows that read ``[start_ns, end_ns]``, in time order."""
    step_ns = _step_ns(mapping)
    first = align_up(start_ns, step_ns)
    if first > end_ns:
        return []
    groups = _names(api, mapping, start_ns, end_ns)
    total = sum(n for names in groups.values() for n in names.values())
    if not total:
        return []
    points = max(1, min(MAX_POINTS, mapping.max_samples // total))
    span = points * step_ns
    whole = span >= SLICE_NS and SLICE_NS % step_ns == 0
    if whole:  # windows of whole time slices, cut at their edges (rule 5)
        span -= span % SLICE_NS
    windows = []
    start = first
    while start <= end_ns:
        # the last step before the next cut, or ``points`` steps on
        stop = (start // span + 1) * span - step_ns if whole else start + (points - 1) * step_ns
        stop = min(stop, end_ns)
        pieces = [
            Piece(q, start, stop, n)
            for inner, names in groups.items()
            for q, n in _pack(inner, names, points, mapping.max_samples)
        ]
        windows.append(Window(start, stop, tuple(pieces)))
        start = stop + step_ns
    return windows


def _names(api: PromApi, mapping: Mapping, start_ns: int, end_ns: int) -> dict[str, dict[str, int]]:
    """Rule 3: series per metric name the mappers store, per distinct selector (its matchers)."""
    groups: dict[str, dict[str, int]] = {}
    for selector in mapping.selectors:
        inner = matchers(selector)
        if inner in groups:
            continue
        counts = groups[inner] = {}
        for labels in api.series(selector, start_ns, end_ns):
            name = labels.get("__name__", "")
            shown = {k: v for k, v in labels.items() if k not in mapping.drop_labels and k != "__name__"}
            if name and maps(name, shown):
                counts[name] = counts.get(name, 0) + 1
    return groups


def _pack(inner: str, names: dict[str, int], points: int, max_samples: int) -> list[tuple[str, int]]:
    """Rule 4: names packed into queries of at most ``max_samples`` points (series × points)."""
    out: list[tuple[str, int]] = []
    batch_names: list[str] = []
    series = 0
    for name, n in sorted(names.items()):
        if batch_names and (series + n) * points > max_samples:
            out.append((_query(inner, batch_names), series))
            batch_names, series = [], 0
        batch_names.append(name)
        series += n
    if batch_names:
        out.append((_query(inner, batch_names), series))
    return out


def _query(inner: str, names: list[str]) -> str:
    """``{__name__="a",...}`` or ``{__name__=~"a|b",...}`` (metric names hold no regex syntax)."""
    name = f'__name__="{names[0]}"' if len(names) == 1 else f'__name__=~"{"|".join(names)}"'
    return f"{{{name},{inner}}}"


def _step_ns(mapping: Mapping) -> int:
    step_ms = round(mapping.step_s * 1000)
    if step_ms <= 0 or not math.isfinite(mapping.step_s):
        raise ValueError(f"step {mapping.step_s!r}: must be at least 1 ms")
    return step_ms * 1_000_000


class Reader:
    """Reads windows into a sink (rules 5-7); one per backfill or follower."""

    def __init__(
        self,
        api: PromApi,
        mapping: Mapping,
        sink: Sink,
        *,
        clock: Callable[[], int] = time.time_ns,
        past: bool = False,
    ):
        self.api, self.mapping, self.sink, self.clock = api, mapping, sink, clock
        # rule 5: a backfill's windows are past slices, read once each: a store packs them as it
        # writes them (Store.write_closed); a sink without that method just writes
        self.write_rows = getattr(sink, "write_closed", sink.write) if past else sink.write
        self.rates: dict[str, CounterRates] = {}
        self.errors_written = 0
        self.origin = f"prometheus {api.base}"

    def read(self, start_ns: int, end_ns: int, progress: Progress | None = None) -> Progress:
        """Every window of ``[start_ns, end_ns]`` written in turn; raises PrometheusError (rule 5)."""
        progress = progress or Progress()
        try:
            for window in plan(self.api, self.mapping, start_ns, end_ns):
                self.read_window(window, progress)
        finally:
            progress.requests = self.api.requests
            self.write_targets(progress)
        return progress

    def read_window(self, window: Window, progress: Progress) -> None:
        """Rule 5: every piece of the window, then its rows in one write per table."""
        m = self.mapping
        rows = Parsed()
        for piece in window.pieces:
            result = self.api.query_range(piece.query, piece.start_ns, piece.end_ns, m.step_s)
            progress.requests = self.api.requests
            rows.extend(
                parse_matrix(
                    result,
                    drop_labels=m.drop_labels,
                    source_label=m.source_label,
                    host_label=m.host_label,
                    default_host=m.host,
                    prefix=m.prefix,
                )
            )
            for series in result:
                labels = series.get("metric") or {}
                source = source_of(labels, m.source_label, m.prefix)
                progress.sources.setdefault(source, str(labels.get(m.host_label, "")) or m.host)
            progress.pieces += 1
            progress.series += len(result)
        self.write(rows, progress)
        progress.done_until_ns = window.end_ns

    def write(self, parsed: Parsed, progress: Progress) -> None:
        for table, rows in parsed.batches.items():
            if table == "engine_samples":
                rows = self._rated(rows)
            got = self.write_rows(table, rows)
            progress.rows[table] = progress.rows.get(table, 0) + int(got or 0)
        if parsed.problems:
            progress.problems += len(parsed.problems)
            self._errors(parsed.problems)

    def _rated(self, rows: Any) -> Any:
        """Rule 5: counter rates per source, each source's rows in time order."""
        out = []
        sources = rows["source"]
        for source in dict.fromkeys(sources):
            index = [i for i, s in enumerate(sources) if s == source]
            part = rows if len(index) == len(sources) else rows.take(index)
            out.append(self.rates.setdefault(source, CounterRates()).apply(part))
        return out[0] if len(out) == 1 else type(rows).concat(out)

    def _errors(self, problems: list[Problem]) -> None:
        room = MAX_ERRORS - self.errors_written
        if room <= 0:
            return
        shown = problems[:room]
        self.errors_written += len(shown)
        now = self.clock()
        self.sink.write(
            "ingest_errors",
            batch(
                "ingest_errors",
                {
                    "ts_ns": [now + i for i in range(len(shown))],
                    "source": [self.origin] * len(shown),
                    "location": [p.location for p in shown],
                    "message": [p.message for p in shown],
                },
            ),
        )

    def write_targets(self, progress: Progress) -> None:
        """Rule 7."""
        if not progress.sources:
            return
        now = self.clock()
        names = sorted(progress.sources)
        n = len(names)
        self.sink.write(
            "targets",
            batch(
                "targets",
                {
                    "target": names,
                    "kind": ["prometheus"] * n,
                    "url": [self.api.base] * n,
                    "host": [progress.sources[s] for s in names],
                    "up": [True] * n,
                    "last_scrape_ns": [progress.done_until_ns] * n,
                    "last_duration_s": [0.0] * n,
                    "last_error": [""] * n,
                    "samples_last": [0] * n,
                    "dropped_last": [0] * n,
                    "consecutive_failures": [0] * n,
                    "updated_ns": [now] * n,
                },
            ),
        )


def backfill(
    api: PromApi,
    mapping: Mapping,
    sink: Sink,
    start_ns: int,
    end_ns: int,
    *,
    progress: Progress | None = None,
) -> Progress:
    """Read ``[start_ns, end_ns]`` into ``sink`` (rules 3-7). On a failure the PrometheusError
    propagates; ``progress`` (pass one in to keep it) then says what was written."""
    return Reader(api, mapping, sink, past=True).read(start_ns, end_ns, progress)


class Follower:
    """Follow mode: each :meth:`poll` reads from where the last one ended up to ``now − lag``.

    Rules:
    1. The first poll starts ``since_s`` before now; later ones at the step after the last
       time read, so no step is read twice and none is skipped.
    2. ``lag_s`` (default one step) leaves Prometheus time to ingest the newest scrape.
    3. A failed poll moves nothing: the next one asks for the same range again (plus what
       came since), so rows are only ever late, never missing.
    """

    def __init__(
        self, api: PromApi, mapping: Mapping, sink: Sink, *, since_s: float, lag_s: float | None = None
    ):
        self.reader = Reader(api, mapping, sink)
        self.step_ns = _step_ns(mapping)
        self.since_ns = int(since_s * NS)
        self.lag_ns = self.step_ns if lag_s is None else int(lag_s * NS)
        self.next_ns: int | None = None
        self.total = Progress()

    def poll(self, now_ns: int) -> Progress:
        start = now_ns - self.since_ns if self.next_ns is None else self.next_ns
        end = (now_ns - self.lag_ns) // self.step_ns * self.step_ns
        progress = Progress()
        if end < align_up(start, self.step_ns):
            return progress
        self.reader.read(start, end, progress)
        self.next_ns = end + self.step_ns
        for table, n in progress.rows.items():
            self.total.rows[table] = self.total.rows.get(table, 0) + n
        self.total.done_until_ns = end
        return progress


def from_spec(spec: PrometheusSourceSpec) -> tuple[Endpoint, Mapping]:
    """The endpoint and mapping of a ``prometheus_sources`` entry (token and password files read now)."""
    token = _read_secret(spec.bearer_token_file) or spec.bearer_token
    password = _read_secret(spec.basic_password_file) or spec.basic_password
    endpoint = Endpoint(
        url=spec.url,
        timeout_s=spec.timeout_s,
        bearer_token=token,
        basic_user=spec.basic_user,
        basic_password=password,
        ca_file=spec.ca_file,
        tls_verify=spec.tls_verify,
        headers=tuple(spec.headers.items()),
    )
    mapping = Mapping(
        selectors=tuple(spec.selectors),
        step_s=spec.step_s,
        drop_labels=tuple(spec.drop_labels),
        source_label=spec.source_label,
        host_label=spec.host_label,
        host=spec.host,
        max_samples=spec.max_samples,
    )
    return endpoint, mapping


def _read_secret(path: str) -> str:
    if not path:
        return ""
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError as exc:
        raise PrometheusError(f"cannot read {path}: {exc.strerror}") from exc
