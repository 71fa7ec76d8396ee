"""The Prometheus HTTP API source without a Prometheus: mapping, planning, bad answers, follow state.

The live comparison with a real Prometheus is tests/test_prometheus_source_live.py. Here a small
stand-in server on 127.0.0.1 answers what a Prometheus answers (and what a broken one does), so
each failure the source must name can be produced on demand.
"""

from __future__ import annotations

import itertools
import json
import os
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA, ROOT, require_component

from collector.formats.exposition import parse
from collector.formats.prom_matrix import parse_matrix
from collector.formats.scrape import parse_scrape
from collector.sources.prometheus_api import (
    MAX_POINTS,
    Endpoint,
    Follower,
    Mapping,
    Progress,
    PromApi,
    PrometheusError,
    backfill,
    matchers,
    plan,
)
from collector.store import Store
from ioeconf.settings import SettingsError, load_settings

T0_S = 1_760_000_000  # a fixed evaluation time (2025-10-09)
NS = 1_000_000_000


# -- a stand-in Prometheus ------------------------------------------------------------------------

Answer = tuple[int, bytes]  # status, body


class StandIn:
    """Answers ``POST /api/v1/<endpoint>`` with ``handler(endpoint, form)``; records every request."""

    def __init__(
        self, handler: Callable[[str, dict[str, str]], Answer], *, tls: ssl.SSLContext | None = None
    ):
        self.handler = handler
        self.requests: list[tuple[str, dict[str, str], dict[str, str]]] = []
        self.released = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                form = dict(urllib.parse.parse_qsl(self.rfile.read(size).decode()))
                endpoint = self.path.rsplit("/", 1)[-1]
                headers = {k.lower(): v for k, v in self.headers.items()}  # names are case-blind
                server.requests.append((endpoint, form, headers))
                status, body = server.handler(endpoint, form)
                if status == 0:  # hang until released
                    server.released.wait(30)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def ok(data: Any) -> Answer:
    return 200, json.dumps({"status": "success", "data": data}).encode()


def matrix(*series: tuple[dict[str, str], list[tuple[float, str]]]) -> Answer:
    result = [{"metric": m, "values": [[t, v] for t, v in values]} for m, values in series]
    return ok({"resultType": "matrix", "result": result})


GPU0 = {"gpu": "0", "UUID": "GPU-0", "Hostname": "n0", "job": "dcgm", "instance": "n0:9400"}
FB = {"__name__": "DCGM_FI_DEV_FB_USED", **GPU0}
UTIL = {"__name__": "DCGM_FI_DEV_GPU_UTIL", **GPU0}
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds")  # fmt: skip
ONE = Mapping(step_s=1.0, selectors=('{job="dcgm"}',))  # one selector: the stand-in ignores match[]


@pytest.fixture
def stand_in() -> Iterator[Callable[..., StandIn]]:
    servers: list[StandIn] = []

    def start(handler: Callable[[str, dict[str, str]], Answer], **kw: Any) -> StandIn:
        servers.append(StandIn(handler, **kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


# -- mapping: the scrape mappers' rows, point by point -----------------------------------------------


def _as_matrix(body: str, t_s: float) -> list[dict[str, Any]]:
    """A scrape body as Prometheus would return it for one step: each sample one series, one point,
    with the target labels Prometheus adds."""
    exp = parse(body)
    return [
        {
            "metric": {"__name__": s.name, **s.labels, "job": "j", "instance": "target-a"},
            "values": [[t_s, repr(s.value)]],
        }
        for s in exp.samples
    ]


@pytest.mark.parametrize(
    "fixture", ["h100x8_k8s_pod_labels.prom", "vllm_0.33.0_dp2.prom", "sglang_0.5.23.prom"]
)
def test_a_step_of_prometheus_gives_the_rows_a_scrape_gives(fixture: str) -> None:
    """Real exporter bodies: the matrix path must give exactly the scrape path's rows (same mappers),
    with the point's time; nothing is mapped twice, nothing is dropped."""
    body = (DATA / "sidecar" / fixture).read_text()
    scraped = parse_scrape(body, kind="auto", ts_ns=T0_S * NS, source="target-a", host="n0").tables
    got = parse_matrix(_as_matrix(body, T0_S), default_host="n0").tables
    assert set(got) == set(scraped) and scraped
    for table, frame in scraped.items():
        key = [c for c in frame.columns if c != "rate_per_s"]
        assert got[table].select(key).sort(key).equals(frame.select(key).sort(key)), table


def test_each_point_keeps_its_own_time_and_units() -> None:
    result = [
        {"metric": FB, "values": [[T0_S, "1024"], [T0_S + 15, "2048"], [T0_S + 30.5, "NaN"]]},
        {"metric": {"__name__": "go_goroutines", "job": "dcgm"}, "values": [[T0_S, "7"]]},
    ]
    got = parse_matrix(result).tables["gpu_samples"]
    assert got["ts_ns"].to_list() == [T0_S * NS, (T0_S + 15) * NS]  # NaN dropped as in a scrape
    assert got["value"].to_list() == [1024 * 2**20, 2048 * 2**20]  # MiB -> bytes, the dcgm mapper's
    assert set(got["host"]) == {"n0"} and set(got["source"]) == {"n0:9400"}


def test_values_the_mappers_refuse_get_the_mappers_answer_point_by_point() -> None:
    """A blank sentinel, a negative counter, NaN and a KV usage over 1.5 in otherwise good series:
    the rows and the problems are those of scraping each point as its own body."""
    energy = {"__name__": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **GPU0}
    kv = {"__name__": "vllm:kv_cache_usage_perc", "engine": "0", "model_name": "m", "instance": "e:8000"}
    series = [
        (energy, ["5000", "1e15", "-3", "7000"]),
        (kv, ["0.5", "2.0", "NaN", "0.7"]),
        (UTIL, ["1", "2", "3", "4"]),
    ]
    result = [{"metric": m, "values": [[T0_S + i, v] for i, v in enumerate(vs)]} for m, vs in series]
    got = parse_matrix(result).tables
    want_rows: dict[str, list[Any]] = {}
    want_problems = 0
    for i in range(4):
        for metric, values in series:
            labels = ",".join(
                f'{k}="{v}"' for k, v in metric.items() if k not in ("__name__", "job", "instance")
            )
            body = f"{metric['__name__']}{{{labels}}} {values[i]}\n"
            source = metric["instance"]
            one = parse_scrape(body, ts_ns=(T0_S + i) * NS, source=source)
            want_problems += len(one.problems)
            for table, frame in one.tables.items():
                want_rows.setdefault(table, []).extend(frame.drop("rate_per_s", strict=False).rows())
    for table, rows in want_rows.items():
        assert sorted(got[table].drop("rate_per_s", strict=False).rows()) == sorted(rows), table
    assert want_problems == len(parse_matrix(result).problems) > 0


def test_a_value_that_is_not_a_number_is_named_and_the_rest_kept() -> None:
    got = parse_matrix([{"metric": UTIL, "values": [[T0_S, "50"], [T0_S + 1, "fifty"]]}])
    assert got.tables["gpu_samples"]["value"].to_list() == [0.5]
    assert "DCGM_FI_DEV_GPU_UTIL" in got.problems[0].location and "'fifty'" in got.problems[0].message


# -- planning -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ('{job="dcgm"}', 'job="dcgm"'),
        ('DCGM_FI_DEV_GPU_UTIL{gpu="0",}', '__name__="DCGM_FI_DEV_GPU_UTIL",gpu="0"'),
        ("vllm:num_requests_running", '__name__="vllm:num_requests_running"'),
    ],
)
def test_selectors_become_matchers(selector: str, expected: str) -> None:
    assert matchers(selector) == expected


@pytest.mark.parametrize("selector", ['{job="a"', "", "{}", "not a name{}", 'a-b{x="1"}'])
def test_bad_selectors_are_refused_quoting_them(selector: str) -> None:
    with pytest.raises(ValueError, match="selector"):
        matchers(selector)


def test_windows_respect_the_point_limits_and_cover_the_range_once(stand_in: Callable[..., StandIn]) -> None:
    """7 days at 15 s of 388 series (an 8-GPU node and its engine): no request over 11,000 points
    per series nor over max_samples points, windows contiguous and step-aligned, every name read."""
    names = {f"DCGM_FI_DEV_F{i}": 8 for i in range(24)} | {f"vllm:{h}_bucket": 49 for h in HISTOGRAMS}
    listed = [{"__name__": n, "gpu": str(k), "le": str(k)} for n, c in names.items() for k in range(c)]
    server = stand_in(lambda e, f: ok(listed))
    step = 15 * NS
    start, end = 1000 * step + 7, 1000 * step + 7 * 86400 * NS
    for cap in (250_000, 1_000, 10_000_000):
        windows = plan(
            PromApi(Endpoint(server.url)),
            Mapping(step_s=15, max_samples=cap, selectors=ONE.selectors),
            start,
            end,
        )
        points = [(w.end_ns - w.start_ns) // step + 1 for w in windows]
        assert max(points) <= MAX_POINTS and max(p.series for w in windows for p in w.pieces) <= 388
        assert all(
            p.series * n <= max(cap, p.series) for w, n in zip(windows, points, strict=True) for p in w.pieces
        )
        assert windows[0].start_ns == 1001 * step and windows[-1].end_ns == end
        assert all(b.start_ns == a.end_ns + step for a, b in itertools.pairwise(windows))
        # rule 5: where a window can hold an hour of every series, windows are cut at hour edges
        hour = 3600 * NS
        assert all((w.start_ns % hour == 0) == (cap >= 388 * 240) for w in windows[1:])
        queried = {
            n
            for p in windows[0].pieces
            for n in names
            if f'"{n}"' in p.query or f"{n}|" in p.query or f'|{n}"' in p.query
        }
        assert queried == set(names) and sum(p.series for p in windows[0].pieces) == 388


# -- the HTTP side: what is sent, and every way an answer can be bad ----------------------------------


def _prometheus(
    names: dict[str, list[tuple[dict[str, str], list[tuple[float, str]]]]],
) -> Callable[..., Answer]:
    """A handler serving ``names`` (metric name -> its series) through /series and /query_range."""

    def handle(endpoint: str, form: dict[str, str]) -> Answer:
        if endpoint == "series":
            return ok([m for series in names.values() for m, _ in series])
        name = form["query"].split('"')[1]
        return matrix(*names.get(name, []))

    return handle


def test_backfill_sends_auth_and_headers_and_stores_the_rows(stand_in: Callable[..., StandIn]) -> None:
    points = [(T0_S + i, str(i)) for i in range(10)]
    server = stand_in(_prometheus({"DCGM_FI_DEV_GPU_UTIL": [(UTIL, points)]}))
    endpoint = Endpoint(server.url, bearer_token="s3cret", headers=(("X-Scope-OrgID", "team-a"),))
    with Store(":memory:") as st:
        progress = backfill(PromApi(endpoint), ONE, st, T0_S * NS, (T0_S + 9) * NS)
        assert st.count("gpu_samples") == 10 and progress.rows["gpu_samples"] == 10
    _, form, headers = server.requests[-1]
    assert headers["authorization"] == "Bearer s3cret" and headers["x-scope-orgid"] == "team-a"
    assert form["query"].startswith('{__name__="DCGM_FI_DEV_GPU_UTIL",') and form["step"] == "1"
    basic = Endpoint(server.url, basic_user="u", basic_password="p")
    PromApi(basic).series('{a="b"}', 0, NS)
    assert server.requests[-1][2]["authorization"] == "Basic dTpw"


def test_a_backfill_writes_whole_hours_packed(stand_in: Callable[..., StandIn], tmp_path: Path) -> None:
    """Rule 5: three hours at 60 s in one window go to the store packed as they are written;
    nothing waits in T_recent for the close, and the rows are those of the answer."""
    start = T0_S // 3600 * 3600
    points = [(start + 60 * i, str(i)) for i in range(180)]
    server = stand_in(_prometheus({"DCGM_FI_DEV_GPU_UTIL": [(UTIL, points)]}))
    mapping = Mapping(step_s=60.0, selectors=ONE.selectors)
    with Store(tmp_path / "s.duckdb") as st:
        progress = backfill(PromApi(Endpoint(server.url)), mapping, st, start * NS, (start + 179 * 60) * NS)
        assert progress.rows["gpu_samples"] == 180
        got = st.con.execute(
            "SELECT count(*) FROM gpu_samples_recent UNION ALL SELECT count(*) FROM gpu_samples_packed"
        )
        assert got.fetchall() == [(0,), (180,)]
        got = st.con.execute("SELECT count(*), sum(value), min(ts_ns) FROM gpu_samples").fetchone()
        assert got == (180, pytest.approx(sum(range(180)) / 100), start * NS)  # GPU_UTIL % -> ratio


BAD = [
    (
        lambda e, f: (503, b'{"status":"error","errorType":"unavailable","error":"tsdb not ready"}'),
        "HTTP 503.*tsdb not ready",
    ),
    (lambda e, f: (200, b"<html>proxy login</html>"), "not JSON"),
    (
        lambda e, f: (
            422,
            b'{"status":"error","errorType":"execution","error":"exceeded maximum resolution"}',
        ),
        "422.*maximum resolution",
    ),
    (
        lambda e, f: ok({"resultType": "vector", "result": []}) if e == "query_range" else ok([FB]),
        "expected a matrix",
    ),
    (lambda e, f: (0, b""), "no answer within"),
]


@pytest.mark.parametrize(("handler", "why"), BAD, ids=["503", "html", "422", "vector", "hang"])
def test_a_bad_answer_is_one_error_naming_the_url(
    stand_in: Callable[..., StandIn], handler: Any, why: str
) -> None:
    server = stand_in(handler)
    api = PromApi(Endpoint(server.url, timeout_s=1.0))
    with Store(":memory:") as st, pytest.raises(PrometheusError, match=why) as err:
        backfill(api, ONE, st, T0_S * NS, (T0_S + 5) * NS)
    assert f"{server.url}/api/v1/" in str(err.value)


def test_no_server_is_one_error_naming_the_url() -> None:
    api = PromApi(Endpoint("http://127.0.0.1:9"))
    with pytest.raises(PrometheusError, match=r"http://127.0.0.1:9/api/v1/series .*cannot connect"):
        api.series('{job="x"}', 0, NS)


def test_rows_written_before_a_failure_are_kept(stand_in: Callable[..., StandIn]) -> None:
    """Two windows (one point of each of two series each): the second window's query fails; the
    first window's rows stay in the store and the progress says up to when; reading again adds
    only what is missing."""
    series = {"DCGM_FI_DEV_FB_USED": [(FB, [(T0_S, "1")])], "DCGM_FI_DEV_GPU_UTIL": [(UTIL, [(T0_S, "5")])]}
    later = {
        "DCGM_FI_DEV_FB_USED": [(FB, [(T0_S + 1, "2")])],
        "DCGM_FI_DEV_GPU_UTIL": [(UTIL, [(T0_S + 1, "6")])],
    }
    failing = {"on": True}

    def handler(endpoint: str, form: dict[str, str]) -> Answer:
        if endpoint == "series":
            return ok([FB, UTIL])
        if form["start"] == f"{T0_S + 1}.000":
            if failing["on"]:
                return 500, b"internal error"
            return matrix(*[s for v in later.values() for s in v])
        return matrix(*[s for v in series.values() for s in v])

    server = stand_in(handler)
    api, progress = PromApi(Endpoint(server.url)), Progress()
    two = Mapping(step_s=1.0, selectors=('{job="dcgm"}',), max_samples=2)  # 2 series: 1 step a window
    with Store(":memory:") as st:
        with pytest.raises(PrometheusError, match="HTTP 500"):
            backfill(api, two, st, T0_S * NS, (T0_S + 1) * NS, progress=progress)
        assert progress.rows == {"gpu_samples": 2} and st.count("gpu_samples") == 2
        assert progress.done_until_ns == T0_S * NS
        failing["on"] = False
        again = backfill(api, two, st, T0_S * NS, (T0_S + 1) * NS)
        assert again.rows == {"gpu_samples": 2} and st.count("gpu_samples") == 4  # the first two not twice


def test_follow_reads_each_step_once_and_retries_a_failed_range(stand_in: Callable[..., StandIn]) -> None:
    down = {"on": False}
    asked: list[tuple[str, str]] = []

    def handler(endpoint: str, form: dict[str, str]) -> Answer:
        if down["on"]:
            return 503, b"{}"
        if endpoint == "series":
            return ok([UTIL])
        asked.append((form["start"], form["end"]))
        start, end = float(form["start"]), float(form["end"])
        return matrix((UTIL, [(float(t), "10") for t in range(int(start), int(end) + 1)]))

    server = stand_in(handler)
    with Store(":memory:") as st:
        f = Follower(PromApi(Endpoint(server.url)), ONE, st, since_s=10, lag_s=1)
        f.poll(T0_S * NS + NS // 2)  # first poll: [T0-9.5, T0-0.5] -> steps T0-9 .. T0-1
        down["on"] = True
        with pytest.raises(PrometheusError):
            f.poll((T0_S + 5) * NS + NS // 2)
        down["on"] = False
        f.poll((T0_S + 8) * NS + NS // 2)  # the failed range again, with what came since
        stamps = [r[0] for r in st.con.execute("SELECT ts_ns FROM gpu_samples ORDER BY 1").fetchall()]
    # steps are whole seconds: the first range starts at the first step inside it
    assert asked == [(f"{T0_S - 9}.000", f"{T0_S - 1}.000"), (f"{T0_S}.000", f"{T0_S + 7}.000")]
    assert stamps == [(T0_S + i) * NS for i in range(-9, 8)]  # every step once, none missing


# -- TLS ----------------------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    openssl = require_component("openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_tls_is_verified_by_default_and_against_a_ca_file(
    stand_in: Callable[..., StandIn], certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = stand_in(lambda e, f: ok([]), tls=context)
    with pytest.raises(PrometheusError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        PromApi(Endpoint(server.url)).series('{job="x"}', 0, NS)  # self-signed: refused
    assert PromApi(Endpoint(server.url, ca_file=str(cert))).series('{job="x"}', 0, NS) == []
    assert PromApi(Endpoint(server.url, tls_verify=False)).series('{job="x"}', 0, NS) == []


# -- settings -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"url": "prom:9090"}, "prometheus_sources.0.url"),
        ({"url": "http://p:9090", "selectors": ['{job="x"']}, "prometheus_sources.0.selectors"),
        ({"url": "http://p:9090", "ca_file": "/nonexistent/ca.pem"}, "prometheus_sources.0.ca_file"),
        ({"url": "http://p:9090", "step_s": 0}, "prometheus_sources.0.step_s"),
    ],
)
def test_bad_source_settings_name_the_field(entry: dict[str, Any], field: str) -> None:
    with pytest.raises(SettingsError, match=field.replace(".", r"\.")):
        load_settings(args={"prometheus_sources": [entry]}, environ={})


# -- the command: one line and an exit code ----------------------------------------------------------------


def _ioe(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "ioe", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (
            ["--prometheus", "http://127.0.0.1:9", "--since", "1x"],
            2,
            "--since '1x': expected a positive number",
        ),
        (
            ["--prometheus", "http://127.0.0.1:9", "--selector", '{job="a"'],
            2,
            "invalid source setting selectors",
        ),
        (
            ["--prometheus", "http://127.0.0.1:9", "--header", "nocolon"],
            2,
            "--header 'nocolon': expected NAME:VALUE",
        ),
        ([], 2, "give --prometheus URL, or a --config with prometheus_sources"),
        (["--prometheus", "http://127.0.0.1:9"], 1, "http://127.0.0.1:9/api/v1/series"),
    ],
)
def test_backfill_command_errors_are_one_line(tmp_path: Path, args: list[str], code: int, said: str) -> None:
    done = _ioe("backfill", "--store", str(tmp_path / "s.duckdb"), *args)
    assert done.returncode == code and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_backfill_command_reads_a_config_and_writes_its_deployments(
    tmp_path: Path, stand_in: Callable[..., StandIn]
) -> None:
    server = stand_in(_prometheus({"DCGM_FI_DEV_GPU_UTIL": [(UTIL, [(T0_S, "7")])]}))
    config = tmp_path / "ioe.yaml"
    source = {"name": "p", "url": server.url, "selectors": ['{job="dcgm"}'], "step_s": 1}
    deployment = {"name": "d", "model": "llama-3.1-8b", "nodes": ["n0"]}
    config.write_text(
        json.dumps({"prometheus_sources": [source], "deployments": [deployment]})
    )  # JSON is YAML
    store = tmp_path / "s.duckdb"
    done = _ioe(
        "backfill", "--config", str(config), "--store", str(store), "--until", str(T0_S), "--since", "10s"
    )
    assert done.returncode == 0, done.stderr
    with Store(store, read_only=True) as st, st.cursor() as cur:
        assert cur.execute("SELECT value FROM gpu_samples").fetchall() == [(0.07,)]
        assert cur.execute("SELECT name FROM deployments").fetchall() == [("d",)]
