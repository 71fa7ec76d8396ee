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


# Rule 11: a ParseCache carried from body to body (one scrape target) changes the cost, never the result.


def _whole(exp: Exposition) -> tuple:
    """Everything a caller reads from a parse (NaN-safe sample keys)."""
    return (_ours(exp), exp.types, exp.helps, exp.problems, exp.openmetrics)


def _bump_values(text: str, step: int) -> str:
    """Each sample line's value moved by ``step`` (comment lines and series texts untouched)."""
    out = []
    for line in text.split("\n"):
        head, blank, value = line.rpartition(" ")
        if blank and not line.startswith("#") and value not in ("NaN", "+Inf", "-Inf"):
            line = f"{head} {float(value) + step * 0.25!r}"
        out.append(line)
    return "\n".join(out)


def _known_scans(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, per parse with a cache, whether the body was read from known series alone."""
    seen: list[bool] = []
    real = exposition._scan_known

    def spy(text, st, memo):  # type: ignore[no-untyped-def]
        seen.append(real(text, st, memo))
        return seen[-1]

    monkeypatch.setattr(exposition, "_scan_known", spy)
    return seen


def _through_cache(bodies: list[str], cache: exposition.ParseCache | None = None, **kw: bool) -> None:
    cache = exposition.ParseCache() if cache is None else cache
    for body in bodies:
        assert _whole(parse(body, cache=cache, **kw)) == _whole(parse(body, **kw))


@pytest.mark.parametrize("path", PROM_FIXTURES + OM_FIXTURES, ids=lambda p: p.name)
def test_warm_cache_equals_cold_parse_as_values_move(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = path.read_text()
    known = _known_scans(monkeypatch)
    _through_cache([_bump_values(text, step) for step in range(4)])
    # the OpenMetrics rendering needs rule 8 renames by position: always the full scan
    assert known == ([False] * 4 if path in OM_FIXTURES else [False, True, True, True])


def test_known_series_with_changed_lines_equal_cold_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each change below breaks the premise of the series path; the result is the full scan's."""
    text = (DATA / "engine" / "vllm_0.33.0_dp2.prom").read_text()
    line = 'python_gc_objects_collected_total{generation="0"} 9747.0'
    other = 'python_gc_objects_collected_total{generation="1"} 1970.0'
    assert text.count(line) == 1 and text.count(other) == 1
    changed = [
        text.replace(line, line.replace("9747.0", "9_747.0")),  # rule 4: a bad value, named
        text.replace(line, line.replace("9747.0", "many")),
        text.replace(line, line + " 1700000000123"),  # a timestamp
        text.replace(line, line + " "),  # a blank after the value
        text.replace(line, line + "\r"),
        text.replace(line, line.replace("9747.0", "97\ufffd")),  # invalid UTF-8 in a value
        text.replace(other, line.replace("9747.0", "5.0")),  # a duplicate series (rule 6)
        text.replace(line, ""),  # a series gone, a blank line in its place
        text.replace(line + "\n", ""),  # a series gone
        text.replace(line, line.replace('"0"', '"3"')),  # a new series
        text.replace("# TYPE vllm:num_requests_running gauge", "# TYPE vllm:num_requests_running counter"),
        text.replace("# TYPE vllm:num_requests_running gauge", "# TYPE vllm:num_requests_running bogus"),
        text,
    ]
    known = _known_scans(monkeypatch)
    cache = exposition.ParseCache()
    for body in changed:
        _through_cache([text, body], cache)
    assert known[-2:] == [True, True]  # the unchanged body after the last change: series path again
    assert known[1::2][:10] == [False] * 10  # none of the changed bodies took the series path
    bad = parse(changed[0], cache=cache)
    assert [p.location for p in bad.problems] == [f"line {text[: text.index(line)].count(chr(10)) + 1}"]


def test_one_label_set_spelled_two_ways_is_a_duplicate_through_the_cache() -> None:
    cache = exposition.ParseCache()
    _through_cache(['x{a="1",b="2"} 1\ny 2\n', 'x{b="2", a="1"} 1\ny 2\n'], cache)
    both = 'x{a="1",b="2"} 1\nx{b="2", a="1"} 2\n'  # the same layout, both series texts known
    exp = parse(both, cache=cache)
    assert _whole(exp) == _whole(parse(both))
    assert [s.value for s in exp.samples] == [1.0] and "duplicate series" in exp.problems[0].message


def test_openmetrics_eof_and_dialect_through_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    known = _known_scans(monkeypatch)
    cache = exposition.ParseCache()
    _through_cache(["a 1\nb 2\n# EOF\n", "a 3\nb 4\n# EOF\n", "a 5\n# EOF\nb 6\n"], cache)
    assert known == [False, True, False]
    _through_cache(["# TYPE a gaugehistogram\na 1\n# EOF\n"] * 2, cache)
    _through_cache(["# TYPE a gaugehistogram\na 1\n# EOF\n"], cache, openmetrics=False)


def test_series_cache_is_bounded_and_forgets_series_that_went_away() -> None:
    cache = exposition.ParseCache(max_labels=100)
    for step in range(30):  # a new pod each time: 10 new series per body
        body = "".join(f'x{{pod="p{step}",i="{i}"}} {i}\n' for i in range(10))
        _through_cache([body, _bump_values(body, 1)], cache)
        assert len(cache.series) <= 100 + 10 and len(cache.ids) <= 100 + 10
    assert len(cache.series) < 30 * 10


def test_known_series_in_another_order_and_rule_8_through_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DATA / "engine" / "sglang_0.5.23.prom").read_text()
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
    lines[at[3]], lines[at[-3]] = lines[at[-3]], lines[at[3]]  # two known series swap places
    known = _known_scans(monkeypatch)
    _through_cache([text, "\n".join(lines)])
    assert known == [False, True]
    # a known series text whose name rule 8 renames under the family now around it
    known.clear()
    bodies = ["vllm_a_total 2\nx 1\n", "# TYPE vllm:a counter\nvllm:a_total 1\nx 1\n"]
    bodies.append("# TYPE vllm:a counter\nvllm_a_total 1\nx 1\n")
    _through_cache(bodies)
    assert known == [False, False, False]
    assert [s.name for s in parse(bodies[-1]).samples] == ["vllm:a_total", "x"]
