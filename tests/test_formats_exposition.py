"""The exposition parser: differential against prometheus_client, and every bad-input case."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from collector.errors import ParseError
from collector.formats import exposition
from collector.formats.exposition import Exposition, parse
from tests.conftest import DATA

PROM_FIXTURES = sorted((DATA / "dcgm").glob("*.prom")) + sorted((DATA / "engine").glob("*.prom"))
OM_FIXTURES = sorted((DATA / "engine").glob("*.openmetrics"))


def _key(name: str, labels: dict[str, str], value: float, ts_ms: float | None) -> tuple:
    return (name, tuple(sorted(labels.items())), "nan" if math.isnan(value) else float(value), ts_ms)


def _ours(exp: Exposition) -> list[tuple]:
    return [_key(s.name, s.labels, s.value, s.timestamp_ms) for s in exp.samples]


def _reference_text(text: str, exp: Exposition) -> list[tuple]:
    """prometheus_client's samples, with its one documented rename undone.

    prometheus_client renames the samples of a counter whose ``# TYPE`` name lacks ``_total``
    to ``<name>_total`` (its OpenMetrics munging; Prometheus itself keeps the name). The TYPE
    line's own name tells exactly when that happened: ``exp.types`` holds it as a counter.
    """
    out = []
    for fam in text_families(text):
        for s in fam.samples:
            name = s.name
            if fam.type == "counter" and exp.types.get(fam.name) == "counter" and name == fam.name + "_total":
                name = fam.name
            ts = None if s.timestamp is None else float(s.timestamp) * 1000
            out.append(_key(name, s.labels, s.value, ts))
    return out


def _colon_form(text: str) -> str:
    """The OpenMetrics body with ``vllm_x`` sample names written as their TYPE's ``vllm:x``.

    prometheus_client's own OpenMetrics parser refuses the body as rendered ("Clashing
    name"), so the reference is computed on this rewrite; our parser must produce the same
    samples from the *original* body (exposition rule 8).
    """
    family, out = "", []
    for line in text.split("\n"):
        if line.startswith(("# TYPE ", "# HELP ")):
            family = line.split()[2]
        elif line and not line.startswith("#") and ":" in family:
            under = family.replace(":", "_")
            if line.startswith(under):
                line = family + line[len(under) :]
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("path", PROM_FIXTURES, ids=lambda p: p.name)
def test_same_samples_as_prometheus_client_text(path: Path) -> None:
    text = path.read_text()
    exp = parse(text)
    assert exp.problems == []
    assert not exp.openmetrics
    assert _ours(exp) == _reference_text(text, exp)
    assert len(exp.samples) > 20


@pytest.mark.parametrize("path", OM_FIXTURES, ids=lambda p: p.name)
def test_same_samples_as_prometheus_client_openmetrics(path: Path) -> None:
    text = path.read_text()
    with pytest.raises(ValueError, match="Clashing name"):
        list(om_families(text))  # the clash is real: the strict parser refuses the body
    exp = parse(text)
    assert exp.openmetrics and exp.problems == []
    reference = [
        _key(s.name, s.labels, s.value, None if s.timestamp is None else float(s.timestamp) * 1000)
        for fam in om_families(_colon_form(text))
        for s in fam.samples
    ]
    assert _ours(exp) == reference
    names = {s.name for s in exp.samples}
    assert "vllm:num_requests_running" in names and "vllm_num_requests_running" not in names


def test_openmetrics_and_text_renderings_agree_on_vllm_values() -> None:
    om = parse((DATA / "engine" / "vllm_0.33.0_dp2.openmetrics").read_text())
    text = parse((DATA / "engine" / "vllm_0.33.0_dp2.prom").read_text())
    pick = {(s.name, s.labels.get("engine")): s.value for s in om.samples}
    assert pick[("vllm:kv_cache_usage_perc", "1")] == 0.52
    from_text = {(s.name, s.labels.get("engine")): s.value for s in text.samples}
    assert from_text[("vllm:kv_cache_usage_perc", "1")] == 0.52
    assert om.types["vllm:num_requests_running"] == "gauge"


def test_clean_and_exact_paths_agree() -> None:
    """The exact line-by-line path gives the same samples as the fast path on a clean body."""
    text = (DATA / "engine" / "vllm_0.33.0_dp2.prom").read_text()
    fast = parse(text)
    slow = parse(text + "\nbroken{ 1\n")  # one bad line forces the exact path for the whole body
    assert fast.samples == slow.samples
    assert [p.location for p in slow.problems] == [f"line {text.count(chr(10)) + 2}"]


BAD_CASES = [
    ("truncated", 'good{a="1"} 1\ncut{a="1",b="\ngood2 2\n', "line 2", "label"),
    ("no value", 'good 1\nnovalue{a="x"}\ngood2 2\n', "line 2", "value"),
    ("bad value", "good 1\nbad 1.2.3\ngood2 2\n", "line 2", "bad value"),
    (
        "duplicate",
        'good{a="1"} 1\ngood{a="1"} 2\ngood2 2\n',
        "line 2",
        "duplicate series, first seen on line 1",
    ),
    ("dup reordered", 'good{a="1",b="2"} 1\ngood{b="2", a="1",} 2\ngood2 2\n', "line 2", "duplicate series"),
    ("unknown type", "# TYPE good bogus\ngood 1\ngood2 2\n", "line 1", "unknown metric type 'bogus'"),
    ("second type", "# TYPE good gauge\n# TYPE good counter\ngood 1\ngood2 2\n", "line 2", "second # TYPE"),
    ("binary", "good 1\n\x00\x01\x02\x8f\x90garbage\ngood2 2\n", "line 2", "invalid metric name"),
    ("utf8", 'good 1\nx{a="\ufffd"} 3\ngood2 2\n', "line 2", "invalid UTF-8"),
    ("dup label", 'good 1\nx{a="1",a="2"} 3\ngood2 2\n', "line 2", "duplicate label name"),
    ("exemplar in text", 'good 1\nx{a="1"} 3 # {t="1"} 1\ngood2 2\n', "line 2", "exemplar"),
]


@pytest.mark.parametrize(("case", "text", "where", "why"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_line_is_named_and_good_samples_kept(case: str, text: str, where: str, why: str) -> None:
    exp = parse(text)
    names = [s.name for s in exp.samples]
    assert "good" in names and "good2" in names
    assert [s.value for s in exp.samples if s.name == "good2"] == [2.0]
    assert len(exp.problems) == 1, exp.problems
    problem = exp.problems[0]
    assert problem.location == where
    assert why in problem.message
    bad_line = text.split("\n")[int(where.split()[1]) - 1]
    assert repr(bad_line.strip())[1:12] in problem.message or "\\x00" in problem.message


def test_nan_and_infinities_are_values_as_in_prometheus() -> None:
    exp = parse("a NaN\nb +Inf\nc -Inf\nd Inf\n")
    values = {s.name: s.value for s in exp.samples}
    assert math.isnan(values["a"]) and values["b"] == math.inf and values["c"] == -math.inf
    assert values["d"] == math.inf and exp.problems == []


def test_underscore_value_refused_like_prometheus_client() -> None:
    exp = parse("a 1_000\nb 2\n")
    assert [s.name for s in exp.samples] == ["b"]
    assert "bad value" in exp.problems[0].message


def test_escapes_and_timestamps() -> None:
    exp = parse('x{path="C:\\\\dir",q="say \\"hi\\"",n="a\\nb"} 1 1700000000123\n')
    (s,) = exp.samples
    assert s.labels == {"path": "C:\\dir", "q": 'say "hi"', "n": "a\nb"}
    assert s.timestamp_ms == 1700000000123.0


def test_openmetrics_timestamps_are_seconds_and_exemplars_dropped() -> None:
    exp = parse('# TYPE x counter\nx_total{a="1"} 5 1700000000.5 # {trace_id="ab"} 1.0\n# EOF\n')
    (s,) = exp.samples
    assert s.timestamp_ms == 1700000000500.0 and s.value == 5.0
    assert exp.problems == []


def test_openmetrics_text_after_eof_and_missing_eof() -> None:
    exp = parse("a 1\n# EOF\nb 2\n", openmetrics=True)
    assert [s.name for s in exp.samples] == ["a"]
    assert exp.problems[0].location == "line 3" and "after # EOF" in exp.problems[0].message
    cut = parse("a 1\nb 2\n", openmetrics=True)
    assert len(cut.samples) == 2 and "without # EOF" in cut.problems[0].message


def test_body_over_the_cap_is_refused_whole() -> None:
    line = 'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
    body = line * (100 * 1024 * 1024 // len(line) + 1)  # a 100 MB body
    with pytest.raises(ParseError, match="exceeds the cap") as err:
        parse(body, source="target-a")
    assert "target-a" in str(err.value)
    assert len(parse(body[: 10 * len(line)]).samples) == 1  # duplicates of one series: the first kept


def test_problem_list_is_capped() -> None:
    garbage = "good 1\n" + "\x00\x01garbage\n" * 5000
    exp = parse(garbage)
    assert [s.name for s in exp.samples] == ["good"]
    assert len(exp.problems) == exposition.MAX_PROBLEMS + 1
    assert exp.problems[-1].message.startswith(f"{5000 - exposition.MAX_PROBLEMS} more bad lines")


def test_type_of_finds_the_family() -> None:
    exp = parse((DATA / "engine" / "vllm_0.33.0_dp2.prom").read_text())
    assert exp.type_of("vllm:time_to_first_token_seconds_bucket") == "histogram"
    assert exp.type_of("vllm:prompt_tokens_total") == "counter"
    assert exp.type_of("no_such_metric") == "untyped"
