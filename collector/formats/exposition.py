"""Prometheus text exposition (0.0.4) and OpenMetrics 1.0, parsed into plain samples.

``parse(text)`` returns every good sample of a body together with the refused lines, so a
scrape with one broken line keeps the rest. It is pure (no I/O, no state between calls) and
is differential-tested against prometheus_client's own parsers on every fixture.

Rules (numbered so that errors and tests can point at them):

1. A body longer than ``max_chars`` characters (default :data:`MAX_BODY_CHARS`, 16 MiB) is
   refused whole with :class:`~collector.errors.ParseError`; nothing is parsed.
2. The dialect is OpenMetrics when ``openmetrics=True`` or, when not given, when the last
   non-blank line is ``# EOF``. OpenMetrics timestamps are seconds and are converted to ms;
   0.0.4 timestamps are already ms; a timestamp past ±9.2e12 ms (the store's 64-bit
   nanoseconds) or non-finite makes the line bad. Exemplars (``# {...} v [ts]`` after an OpenMetrics value)
   are dropped; in 0.0.4 text they make the line bad.
3. A sample line is ``name[{labels}] value [timestamp]``. Names match
   ``[a-zA-Z_:][a-zA-Z0-9_:]*``, label names ``[a-zA-Z_][a-zA-Z0-9_]*``, label values are
   double-quoted with ``\\\\``, ``\\"`` and ``\\n`` unescaped (other escapes kept as written, like
   prometheus_client). A trailing comma inside the braces is allowed. UTF-8 quoted metric
   names (``{"a.b"}``) are not supported and make the line bad.
4. Values are read as prometheus_client reads them: any spelling Python's ``float`` accepts
   except ones with ``_``. ``NaN``, ``+Inf`` and ``-Inf`` are valid values and kept: deciding
   whether a non-finite value is meaningful is the canonical mappers' job (dcgm/engine).
5. Bad lines become a :class:`~collector.errors.Problem` naming the line number and quoting
   it: unparseable or truncated samples, a bad value or timestamp, a duplicate label name,
   invalid UTF-8 (U+FFFD after decoding), a ``# TYPE`` with an unknown type (the family is
   then treated as untyped), a second ``# TYPE`` for one family (the first wins), and lines
   after an OpenMetrics ``# EOF``.
6. A duplicate series (same name and label set as an earlier sample of the body) is refused;
   the first value is kept.
7. At most :data:`MAX_PROBLEMS` problems are listed per body; one last problem counts the rest,
   so a body of binary garbage cannot produce a million-entry report.
8. The ``vllm_`` / ``vllm:`` OpenMetrics name clash: prometheus_client (≥ 0.2x) renders
   ``vllm:x`` samples as ``vllm_x_total`` under ``# TYPE vllm:x counter`` when it negotiates
   OpenMetrics. A sample whose name starts with the current family's name with ``:`` replaced
   by ``_`` is renamed back to the colon form, so every consumer sees one spelling. This
   applies to any family with a colon (``vllm:``, ``sglang:``, ...), in both dialects.
9. Sample names are kept as written. (prometheus_client's 0.0.4 parser renames the samples
   of a counter whose TYPE name lacks ``_total`` to ``<name>_total``; Prometheus itself does
   not, and neither does this parser.)

10. ``Sample.labels`` is a read-only mapping shared by every sample of one body that has the
    same label block (it is built once per distinct block); copy it before changing it.
11. A caller that parses one target's body again and again (a scraper) may pass a
    :class:`ParseCache`: label blocks already seen are not parsed again (their mappings are
    then shared with later bodies too), and when the comment lines of a clean body are the
    same as last time their ``# TYPE``/``# HELP`` are reused instead of re-read. It also keeps
    the *series text* of each sample line of a clean body (the line before its last space,
    when the text after that space is the whole value) with the sample's name, labels and a
    series id, as Prometheus keeps series references from scrape to scrape. A later body
    whose comment and blank lines are those of the last clean body, line for line, and whose
    every other line is a known series text, a space and a whole value token (no blank,
    ``\r``, ``_``, ``#``, ``{`` or ``}``) is read from those series and its values alone; two
    lines of one series id are a duplicate (rule 6), and a body where rule 8 could rename
    goes to the full scan. Anything else (a new series, a changed comment line, a timestamp)
    is parsed in full and teaches the cache. The result is identical with or without it; the
    cache holds at most ``max_labels`` label blocks and ``max_labels`` series texts (each
    cleared whole past that), so series that come and go cannot grow it without bound.

12. :func:`body_shape` splits a body the fast path accepts whole (no timestamps, nothing it
    would refuse) into its *shape* — the comment lines, sample names and label blocks, in
    order — and the value texts of its sample lines, so a caller can tell that a body differs
    from an earlier one in its values alone. :class:`Skeleton` makes the same check against
    one remembered body without the full scan: ``Skeleton.learn(text)`` remembers a body
    ``body_shape`` accepts, line for line but for the text after the last space of each
    sample line; ``skeleton.values(text)`` gives a later body's value texts when its lines are
    the remembered ones but for those texts and each text is a whole value token (no blank,
    ``_``, ``#``, ``{`` or ``}``), else None. Such a body has the remembered shape: the label
    block ends before the last space, so only the value can differ.

Three paths accept the same language: with a :class:`ParseCache`, the series path of rule 11
for a body made of known series and new values (what a scraper mostly runs, and what the
benchmark's ``ioe`` side measures); a column-wise fast path for any clean body (``ioe cold``);
and an exact line-by-line path, used for the whole body as soon as anything is refused, that
names every problem with its line number.

This parser is laxer than Prometheus's Go parser in one way: it does not check that samples
of one family are contiguous or that histogram buckets are ordered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, compress, repeat
from operator import itemgetter
from types import MappingProxyType
from typing import Any, NamedTuple

from collector.errors import ParseError, Problem, quote

MAX_BODY_CHARS = 16 * 1024 * 1024
MAX_PROBLEMS = 100
MAX_TIMESTAMP_MS = 9.2e12  # the store keeps nanoseconds in a signed 64-bit integer

TYPES_004 = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
TYPES_OM = frozenset(
    {"counter", "gauge", "histogram", "gaugehistogram", "summary", "stateset", "info", "unknown"}
)

_QUOTED = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'  # a double-quoted string, unrolled for speed
_LABEL = rf"[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*{_QUOTED}[ \t]*"
_LABEL_BLOCK = re.compile(rf"(?:{_LABEL},)*(?:{_LABEL})?[ \t]*")
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"')
_SAMPLE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"  # metric name
    r'(?:[ \t]*\{((?:[^"}]|"(?:[^"\\\n]|\\.)*")*)\}[ \t]*|[ \t]+)'  # {labels} or a blank
    r"([^ \t#]+)"  # value
    r"(?:[ \t]+([^ \t#]+))?"  # timestamp
    r"(?:[ \t]+(#.*))?"  # exemplar (OpenMetrics only)
)
_FAST = re.compile(  # ``.`` never matches a newline here (no DOTALL)
    r"^[ \t]*(?:(#.*)"  # 1: a comment line
    r"|([a-zA-Z_:][a-zA-Z0-9_:]*)"  # 2: metric name
    r"(?:[ \t]*\{(.*)\}[ \t]*|[ \t]+)"  # 3: label block, first '{' to last '}'
    r"([^ \t\r\n_#{}]+)"  # 4: value
    r"(?:[ \t]+([^ \t\r\n_#{}]+))?[ \t]*\r?$"  # 5: timestamp
    r"|(.+))",  # 6: anything else
    re.M,
)
_UNESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPE_HELP = re.compile(r"\\[\\n]")
_LabelSet = frozenset[tuple[str, str]]
_NO_LABELS: Mapping[str, str] = MappingProxyType({})
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


class Sample(NamedTuple):
    """One sample: metric name as written (rule 8 aside), labels, value, timestamp in ms."""

    name: str
    labels: Mapping[str, str]  # read-only; shared by the samples of one body with equal labels
    value: float
    timestamp_ms: float | None = None


# Builds a Sample from a 4-tuple in C, skipping NamedTuple's Python-level __new__ (fast path).
_new_sample = partial(tuple.__new__, Sample)


@dataclass
class Exposition:
    """A parsed body: samples in input order, declared types and help, refused lines."""

    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    openmetrics: bool = False
    source: str = ""

    def type_of(self, sample_name: str) -> str:
        """The declared type of the family a sample belongs to ('untyped' if none)."""
        found = self.types.get(sample_name)
        if found is not None:
            return found
        for suffix in ("_total", "_bucket", "_count", "_sum", "_created", "_gcount", "_gsum", "_info"):
            if sample_name.endswith(suffix):
                found = self.types.get(sample_name[: -len(suffix)])
                if found is not None:
                    return found
        return "untyped"


def series_text(sample: Sample, limit: int = 240) -> str:
    """``name{k="v",...}`` of a sample, cut at ``limit`` characters: how a problem names it."""
    inner = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
    text = f"{sample.name}{{{inner}}}" if inner else sample.name
    return text if len(text) <= limit else text[:limit] + "…"


def is_openmetrics(text: str) -> bool:
    """Rule 2: the body ends with ``# EOF`` (trailing blank lines allowed)."""
    return text.rstrip().endswith("\n# EOF") or text.strip() == "# EOF"


class _Series(NamedTuple):
    """What a known series text stands for (rule 11)."""

    name: str
    labels: Mapping[str, str]
    id: int


class _Layout(NamedTuple):
    """The last clean body's lines (rule 11): where its samples were, its other lines, its series."""

    om: bool
    lines: int
    others_at: Any  # lines -> the comment and blank lines (a picker)
    samples_at: Any  # lines -> the sample lines (a picker)
    others: tuple[str, ...]
    prefixes: tuple[str, ...]  # the series text of each sample line, in order
    names: tuple[str, ...]
    labels: tuple[Mapping[str, str], ...]
    types: dict[str, str]
    helps: dict[str, str]
    eof: bool
    spaces: tuple[str, ...]  # "\nns_" of each family with a colon: where rule 8 could rename


@dataclass
class ParseCache:
    """What one target's parses keep for the next (rule 11); never shared between targets."""

    labels: dict[str, tuple[Mapping[str, str] | str, _LabelSet | None]] = field(default_factory=dict)
    max_labels: int = 50_000
    comments: tuple[bool, tuple[str, ...]] | None = None  # (OpenMetrics?, comment column)
    types: dict[str, str] = field(default_factory=dict)
    helps: dict[str, str] = field(default_factory=dict)
    eof: bool = False

    series: dict[str, _Series] = field(default_factory=dict)  # series text -> its sample's parts
    ids: dict[tuple[str, _LabelSet | None], int] = field(default_factory=dict)  # (name, label set) -> id
    layout: _Layout | None = None  # the last clean body's non-sample lines, where they were

    def label_cache(self) -> dict[str, tuple[Mapping[str, str] | str, _LabelSet | None]]:
        if len(self.labels) > self.max_labels:
            self.labels.clear()
        if len(self.series) > self.max_labels:
            self.forget_series()
        self.labels.setdefault("", (_NO_LABELS, frozenset()))
        return self.labels

    def forget_series(self) -> None:
        self.series.clear()
        self.ids.clear()
        self.layout = None

    def clear(self) -> None:
        """Everything forgotten (the next body is parsed as if for the first time)."""
        self.labels.clear()
        self.comments = None
        self.forget_series()


def parse(
    text: str,
    *,
    source: str = "",
    openmetrics: bool | None = None,
    max_chars: int = MAX_BODY_CHARS,
    cache: ParseCache | None = None,
) -> Exposition:
    """Parse one exposition body; see the module docstring for every rule applied."""
    if len(text) > max_chars:
        raise ParseError(
            f"body of {len(text):,} characters exceeds the cap of {max_chars:,} (rule 1)",
            source=source,
            snippet=text[:80],
        )
    om = is_openmetrics(text) if openmetrics is None else openmetrics
    state = _State(text, Exposition(openmetrics=om, source=source), cache)
    if not (cache is not None and _scan_known(text, state, cache)) and not _scan_clean(text, state):
        state = _State(text, Exposition(openmetrics=om, source=source), cache)
        _scan_exact(text, state)
    if om and not state.eof:
        state.problem(0, "", "OpenMetrics body without # EOF: it may be truncated (rule 2)")
    state.finish()
    return state.exp


Shape = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]


def body_shape(text: str) -> tuple[Shape, list[str]] | None:
    """Rule 12: (shape, value texts of the sample lines in order), or None for a body with a
    timestamp or a line the fast path does not take (the caller then parses it in full)."""
    rows = _FAST.findall(text)
    if not rows:
        return None
    comments, names, blocks, values, stamps, others = zip(*rows, strict=True)
    if any(others) or any(stamps):
        return None
    return (comments, names, blocks), list(compress(values, names))


_VALUE_TEXTS = re.compile(r"[^ \t\r\n_#{}]+(?:\n[^ \t\r\n_#{}]+)*")  # value tokens, one per line
_VALUE_BYTES = re.compile(_VALUE_TEXTS.pattern.encode())  # the same, over a body's bytes


def picker(index: list[int]) -> Any:
    """``seq -> tuple of seq[i] for i in index`` in C (itemgetter of one index gives no tuple)."""
    if len(index) > 1:
        return itemgetter(*index)
    return lambda seq: tuple(seq[i] for i in index)


class Skeleton:
    """Rule 12 against one remembered body, at a fraction of :func:`body_shape`'s cost."""

    __slots__ = ("_encoded", "_others_at", "_samples_at", "lines", "others", "prefixes")

    def __init__(self, lines: list[str], samples: list[int]):
        chosen = set(samples)
        self.lines = len(lines)
        self._samples_at = picker(samples)
        self._others_at = picker([i for i in range(len(lines)) if i not in chosen])
        self.others: tuple[str, ...] = self._others_at(lines)  # comment and empty lines, whole
        self.prefixes = tuple(line.rpartition(" ")[0] for line in self._samples_at(lines))
        self._encoded: tuple[tuple[bytes, ...], tuple[bytes, ...]] | None = None

    @classmethod
    def learn(cls, text: str) -> tuple[Skeleton, list[str]] | None:
        """The skeleton of a body :func:`body_shape` accepts and its value texts, or None."""
        shape = body_shape(text)
        if shape is None:
            return None
        lines = text.split("\n")
        samples = [i for i, line in enumerate(lines) if line and not line.lstrip(" \t").startswith("#")]
        skeleton = cls(lines, samples)
        # the premise of the cheap check, verified once: each sample's value is its last token
        return (skeleton, shape[1]) if skeleton.values(text) == shape[1] else None

    def values(self, text: str) -> list[str] | None:
        """The value texts of ``text`` if it has this skeleton (rule 12), else None."""
        return self._matched(text.split("\n"), self.others, self.prefixes, " ", _VALUE_TEXTS)

    def byte_values(self, body: bytes) -> list[bytes] | None:
        """:meth:`values` of the UTF-8 ``body`` without decoding it: the value texts as bytes
        (ASCII: ``float`` takes them), or None when the bytes do not match.

        1. Lines are compared as bytes with the remembered lines encoded: equal bytes decode to
           equal text (a newline never sits inside a UTF-8 sequence, so lines decode alone), so
           a match here is a match of :meth:`values`. A body whose bytes differ but whose text
           would match (two invalid sequences both decode to U+FFFD) gets None, and the caller's
           full path (which tries :meth:`values` first) takes it.
        2. A value token that is not ASCII is refused by ``float`` over bytes, which the text's
           ``float`` might take (another script's digits): None again, never a different row.
        3. Over the text's way this skips decoding and works on one byte per character: ~35 %
           less CPU on the bench's three bodies, ~55 % on one that holds a non-ASCII character
           (bench/results/sidecar.md, round 10)."""
        encoded = self._encoded
        if encoded is None:
            try:
                encoded = (
                    tuple(line.encode() for line in self.others),
                    tuple(prefix.encode() for prefix in self.prefixes),
                )
            except UnicodeEncodeError:  # a lone surrogate in a text given as str: the text's way only
                encoded = ((b"\n",), ())  # no body's lines equal a line holding a newline
            self._encoded = encoded
        others, prefixes = encoded
        return self._matched(body.split(b"\n"), others, prefixes, b" ", _VALUE_BYTES)

    def _matched(
        self, lines: list[Any], others: tuple[Any, ...], prefixes: tuple[Any, ...], space: Any, tokens: Any
    ) -> list[Any] | None:
        """Rule 12 over a body's ``lines``, all ``str`` or all ``bytes`` (``space`` and the pattern
        ``tokens`` of the same type): the same count of lines, the comment and empty lines equal to
        ``others``, each sample line ``prefix + space + value`` with its ``prefixes`` entry, and
        the values one token each; the values, else None."""
        if len(lines) != self.lines or self._others_at(lines) != others:
            return None
        parts = list(map(type(space).rpartition, self._samples_at(lines), repeat(space)))
        if tuple(map(itemgetter(0), parts)) != prefixes:
            return None
        values = list(map(itemgetter(2), parts))
        newline = "\n" if isinstance(space, str) else b"\n"
        return values if tokens.fullmatch(newline.join(values)) else None


def _scan_clean(text: str, st: _State) -> bool:
    """Fast path for a clean body: column-wise work in C, Python only per distinct label set.

    Returns False, leaving ``st`` half-filled, when the body has anything it does not fully
    accept (a problem, an exemplar, a timestamp, invalid UTF-8, text after ``# EOF``): the
    caller then reparses the whole body with :func:`_scan_exact`, which names every problem
    with its line number. Both paths accept the same language.
    """
    if st.check_utf8:
        return False
    rows = _FAST.findall(text)
    if not rows:
        return True
    comments, names, blocks, value_texts, stamps, others = zip(*rows, strict=True)
    if any(others) or any(stamps) or not _clean_comments_cached(comments, st):
        return False
    if st.eof and (rows[-1][1] or comments.count(rows[-1][0]) != 1):
        return False  # text after # EOF
    is_sample = names
    names, blocks = tuple(compress(names, is_sample)), tuple(compress(blocks, is_sample))
    try:
        values = list(map(float, compress(value_texts, is_sample)))
    except ValueError:
        return False
    cache = st.label_cache
    for block in set(blocks).difference(cache):
        cache[block] = _parse_labels(block)
    label_sets, canons = zip(*map(cache.__getitem__, blocks), strict=True) if blocks else ((), ())
    if None in canons:
        return False
    clash = _has_clash(st, names)
    if clash:
        names = tuple(_renamed(rows))
    if len(set(zip(names, canons, strict=True))) != len(names):
        return False
    st.exp.samples.extend(map(_new_sample, zip(names, label_sets, values, repeat(None))))
    if st.cache is not None and not clash:
        _learn(text, st, st.cache, names, label_sets, canons, tuple(compress(value_texts, is_sample)))
    return True


def _learn(
    text: str,
    st: _State,
    memo: ParseCache,
    names: tuple[str, ...],
    label_sets: tuple[Mapping[str, str], ...],
    canons: tuple[_LabelSet | None, ...],
    value_texts: tuple[str, ...],
) -> None:
    """Rule 11: remember the series texts of a clean body the fast scan accepted (no rule-8
    rename), and its layout when every sample line is ``series text + " " + value``.

    The fast scan's rows are the body's non-empty lines in order, so its sample rows are the
    non-empty lines that are not comments.
    """
    memo.layout = None
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if line and not line.lstrip(" \t").startswith("#")]
    if len(at) != len(names):
        return
    series, ids, every = memo.series, memo.ids, True
    prefixes = []
    for i, name, labels, canon, value_text in zip(at, names, label_sets, canons, value_texts, strict=True):
        prefix, blank, tail = lines[i].rpartition(" ")
        if not blank or tail != value_text:
            every = False  # e.g. blanks after the value: such a line is parsed in full every time
            continue
        sid = ids.get((name, canon))
        if sid is None:
            sid = ids[(name, canon)] = len(ids)
        series[prefix] = _Series(name, labels, sid)
        prefixes.append(prefix)
    if not every:
        return
    chosen = set(at)
    others_at = picker([i for i in range(len(lines)) if i not in chosen])
    spaces = {f.split(":", 1)[0] + "_" for f in chain(st.exp.types, st.exp.helps) if ":" in f}
    memo.layout = _Layout(
        st.om,
        len(lines),
        others_at,
        picker(at),
        others_at(lines),
        tuple(prefixes),
        names,
        label_sets,
        dict(st.exp.types),
        dict(st.exp.helps),
        st.eof,
        tuple("\n" + space for space in sorted(spaces)),
    )


def _scan_known(text: str, st: _State, memo: ParseCache) -> bool:
    """Rule 11: a body read from known series texts and its value texts alone, or False
    (``st`` untouched) when it is not the last clean body's lines but for known series and values."""
    layout = memo.layout
    if layout is None or layout.om != st.om or st.check_utf8:
        return False
    lines = text.split("\n")
    if len(lines) != layout.lines or layout.others_at(lines) != layout.others:
        return False
    parts = list(map(str.rpartition, layout.samples_at(lines), repeat(" ")))
    prefixes = tuple(map(itemgetter(0), parts))
    if prefixes == layout.prefixes:  # the same series in the same order as the clean body learned
        names, label_sets = layout.names, layout.labels
    else:
        found = list(map(memo.series.get, prefixes))
        if None in found:
            return False  # a new series or not a sample line: the full scan
        names, label_sets, ids = zip(*found, strict=True)
        if len(set(ids)) != len(ids):
            return False  # a duplicate series: the full scan names it
        if layout.spaces:
            joined = "\n" + "\n".join(names)
            if any(space in joined for space in layout.spaces):
                return False  # rule 8 may rename by position: the full scan does it
    value_texts = list(map(itemgetter(2), parts))
    if value_texts and not _VALUE_TEXTS.fullmatch("\n".join(value_texts)):
        return False
    try:
        values = list(map(float, value_texts))
    except ValueError:
        return False
    st.exp.types, st.exp.helps, st.eof = dict(layout.types), dict(layout.helps), layout.eof
    st.exp.samples.extend(map(_new_sample, zip(names, label_sets, values, repeat(None))))
    return True


def _clean_comments_cached(comments: tuple[str, ...], st: _State) -> bool:
    """:func:`_clean_comments`, or its last clean outcome when the comment lines are unchanged (rule 11)."""
    memo = st.cache
    if memo is None:
        return _clean_comments(comments, st)
    if memo.comments == (st.om, comments):
        st.exp.types, st.exp.helps, st.eof = dict(memo.types), dict(memo.helps), memo.eof
        return True
    memo.comments = None
    if not _clean_comments(comments, st):
        return False
    memo.comments, memo.types, memo.helps, memo.eof = (
        (st.om, comments),
        dict(st.exp.types),
        dict(st.exp.helps),
        st.eof,
    )
    return True


def _clean_comments(comments: tuple[str, ...], st: _State) -> bool:
    """Types and help from the comment lines; False on any problem or a second ``# EOF``."""
    for comment in filter(None, comments):
        if st.eof:
            return False
        st.comment(0, comment.strip())
        if st.exp.problems:
            return False
    return True


def _has_clash(st: _State, names: tuple[str, ...]) -> bool:
    """Rule 8 can apply: a family has a colon and a sample starts with its ``ns_`` spelling."""
    spaces = {f.split(":", 1)[0] + "_" for f in chain(st.exp.types, st.exp.helps) if ":" in f}
    if not spaces:
        return False
    joined = "\n" + "\n".join(names)  # one C-level search per namespace, not one call per name
    return any(f"\n{space}" in joined for space in spaces)


def _renamed(rows: list[tuple[str, ...]]) -> Iterator[str]:
    """Rule 8 in order: each sample's name, renamed back to its current family's colon form."""
    family = clash = ""
    for comment, name, *_ in rows:
        if name:
            yield family + name[len(clash) :] if clash and name.startswith(clash) else name
            continue
        parts = comment.split(None, 3)
        if len(parts) >= 3 and parts[1] in ("TYPE", "HELP", "UNIT") and parts[2] != family:
            family = parts[2]
            clash = family.replace(":", "_") if ":" in family else ""


def _scan_exact(text: str, st: _State) -> None:
    """The exact path: line by line, every refused line becomes a Problem with its number."""
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line:
            pass
        elif st.eof:
            st.problem(lineno, raw, "text after # EOF (rule 5)")
        elif line[0] == "#":
            st.comment(lineno, line)
        else:
            st.sample(lineno, line)


class _State:
    """Per-call parsing state (never shared between calls)."""

    def __init__(self, text: str, exp: Exposition, cache: ParseCache | None = None) -> None:
        self.exp = exp
        self.cache = cache
        self.om = exp.openmetrics
        self.check_utf8 = "\ufffd" in text
        self.eof = False
        self.family = ""
        self.clash = ""  # rule 8: the family's name with ':' replaced by '_', when it has one
        self.seen: dict[tuple[str, _LabelSet | None], int] = {}
        self.label_cache: dict[str, tuple[Mapping[str, str] | str, _LabelSet | None]] = (
            {"": (_NO_LABELS, frozenset())} if cache is None else cache.label_cache()
        )
        self.names_ok: set[str] = set()
        self.extra_problems = 0

    def problem(self, lineno: int, line: str, message: str) -> None:
        if len(self.exp.problems) >= MAX_PROBLEMS:
            self.extra_problems += 1
            return
        where = f"line {lineno}" if lineno else "end of body"
        text = f"{message}: {quote(line)}" if line else message
        self.exp.problems.append(Problem(where, text))

    def finish(self) -> None:
        if self.extra_problems:
            self.exp.problems.append(
                Problem("body", f"{self.extra_problems} more bad lines not listed (rule 7)")
            )

    def comment(self, lineno: int, line: str) -> None:
        parts = line.split(None, 3)
        kind = parts[1] if len(parts) > 1 else ""
        if kind == "EOF" and self.om and len(parts) == 2:
            self.eof = True
        elif kind == "TYPE":
            self.type_line(lineno, line, parts)
        elif kind == "HELP" and len(parts) >= 3:
            self.set_family(parts[2])
            doc = parts[3] if len(parts) == 4 else ""
            self.exp.helps.setdefault(parts[2], _UNESCAPE_HELP.sub(_replace, doc) if "\\" in doc else doc)
        elif kind == "UNIT" and len(parts) >= 3:
            self.set_family(parts[2])

    def type_line(self, lineno: int, line: str, parts: list[str]) -> None:
        if len(parts) != 4 or not _is_metric_name(parts[2]):
            self.problem(lineno, line, "malformed # TYPE line (rule 5)")
            return
        name, typ = parts[2], parts[3].strip()
        self.set_family(name)
        allowed = TYPES_OM if self.om else TYPES_004
        if name in self.exp.types:
            self.problem(lineno, line, f"second # TYPE for {name}; the first wins (rule 5)")
        elif typ not in allowed:
            self.problem(lineno, line, f"unknown metric type {typ!r}; family treated as untyped (rule 5)")
            self.exp.types[name] = "unknown" if self.om else "untyped"
        else:
            self.exp.types[name] = typ

    def set_family(self, name: str) -> None:
        if name != self.family:
            self.family = name
            self.clash = name.replace(":", "_") if ":" in name else ""

    def sample(self, lineno: int, line: str) -> None:
        split = self.split(line)
        if isinstance(split, str):
            self.problem(lineno, line, split)
            return
        name, block, value_text, ts_text = split
        if self.check_utf8 and "\ufffd" in line:
            self.problem(lineno, line, "invalid UTF-8 (rule 5)")
            return
        labels, canon = self.labels(block)
        if isinstance(labels, str):
            self.problem(lineno, line, labels)
            return
        sample = self.build(name, labels, value_text, ts_text)
        if isinstance(sample, str):
            self.problem(lineno, line, sample)
            return
        key = (sample.name, canon)
        first = self.seen.get(key)
        if first is not None:
            self.problem(
                lineno, line, f"duplicate series, first seen on line {first}; kept the first (rule 6)"
            )
            return
        self.seen[key] = lineno
        self.exp.samples.append(sample)

    def split(self, line: str) -> tuple[str, str, str, str | None] | str:
        """``(name, label block, value, timestamp)`` of a sample line, or an error message.

        Fast path: the label block runs from the first ``{`` to the last ``}`` (a value or a
        timestamp never holds a brace); a line with ``#`` (an exemplar, or a label value) goes
        through the full regular expression instead.
        """
        if "#" in line:
            return self.split_exemplar(line)
        brace = line.find("{")
        if brace < 0:
            parts = line.split()
            name, block, rest = parts[0], "", parts[1:]
        else:
            close = line.rfind("}")
            if close < brace:
                return "unterminated label set (rule 3)"
            name, block, rest = line[:brace].rstrip(), line[brace + 1 : close], line[close + 1 :].split()
        if name not in self.names_ok:
            if not _is_metric_name(name):
                return f"invalid metric name {name!r} (rule 3)"
            self.names_ok.add(name)
        if not 1 <= len(rest) <= 2:
            return "expected `value [timestamp]` after the name and labels (rule 3)"
        return name, block, rest[0], rest[1] if len(rest) == 2 else None

    def split_exemplar(self, line: str) -> tuple[str, str, str, str | None] | str:
        m = _SAMPLE.fullmatch(line)
        if m is None:
            return "not a sample line `name{labels} value [timestamp] [# exemplar]` (rule 3)"
        name, block, value_text, ts_text, exemplar = m.groups()
        if exemplar is not None and not self.om:
            return "exemplar in 0.0.4 text (rule 2)"
        return name, block or "", value_text, ts_text

    def labels(self, block: str) -> tuple[Mapping[str, str] | str, _LabelSet | None]:
        """``(labels, label set)`` for a ``{...}`` body, or ``(error, None)``; cached per call."""
        cached = self.label_cache.get(block)
        if cached is None:
            cached = _parse_labels(block)
            self.label_cache[block] = cached
        return cached

    def build(
        self, name: str, labels: Mapping[str, str], value_text: str, ts_text: str | None
    ) -> Sample | str:
        value = _number(value_text)
        if value is None:
            return f"bad value {value_text!r} (rule 4)"
        ts_ms = None
        if ts_text is not None:
            ts = _number(ts_text)
            if ts is None:
                return f"bad timestamp {ts_text!r} (rule 2)"
            ts_ms = ts * 1000.0 if self.om else ts
            if not abs(ts_ms) < MAX_TIMESTAMP_MS:
                return f"timestamp {ts_text!r} is out of range (rule 2)"
        if self.clash and name.startswith(self.clash):
            name = self.family + name[len(self.clash) :]
        return Sample(name, labels, value, ts_ms)


def _replace(m: re.Match[str]) -> str:
    return _ESCAPES[m.group(0)]


def _parse_labels(block: str) -> tuple[Mapping[str, str] | str, _LabelSet | None]:
    """Rule 3: ``(labels, label set)`` of a ``{...}`` body, or ``(error message, None)``.

    The frozen label set is equal for two blocks that spell one label set differently
    (order, blanks, trailing comma), so rule 6 sees them as one series; it caches its hash,
    so keying every sample by it stays cheap.
    """
    compact = _compact_labels(block)
    if compact is not None:
        return MappingProxyType(compact), frozenset(compact.items())
    pairs = _LABEL_PAIR.findall(block)
    if ",".join([f'{k}="{v}"' for k, v in pairs]) != block and not _LABEL_BLOCK.fullmatch(block):
        return "malformed label set (rule 3)", None
    labels = dict(pairs) if "\\" not in block else {k: _UNESCAPE.sub(_replace, v) for k, v in pairs}
    if len(labels) != len(pairs):
        return "duplicate label name (rule 3)", None
    return MappingProxyType(labels), frozenset(labels.items())


def _compact_labels(block: str) -> dict[str, str] | None:
    """The labels of a compact block without escapes (``a="x",b="y"``), else None.

    Without backslashes a value cannot hold a ``"``, so splitting on ``",`` is exact; any
    blank, trailing comma, escape or odd name sends the block to the regular expressions.
    """
    if "\\" in block or not block.endswith('"'):
        return None
    parts = [p.partition('="') for p in block[:-1].split('",')]
    for name, sep, value in parts:
        if not sep or '"' in value or not name.isidentifier() or not name.isascii():
            return None
    labels = {name: value for name, _, value in parts}
    return labels if len(labels) == len(parts) else None


def _is_metric_name(name: str) -> bool:
    """Rule 3: ``[a-zA-Z_:][a-zA-Z0-9_:]*`` (C-level string checks, no regex call)."""
    return name.isascii() and name.replace(":", "_").isidentifier()


def _number(text: str) -> float | None:
    """Rule 4: ``float`` spelling without underscores, else None."""
    if "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        return None
