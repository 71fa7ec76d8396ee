"""``dcgmi dmon`` text output -> ``gpu_samples`` rows (fixture h800x8_dcgmi_dmon_nvlink_pcie.txt).

``dcgmi dmon -e 1011,1012`` prints a header naming each column by a short tag, then one line
per entity per sample interval::

    #Entity   NVLTX        NVLRX
    ID
    GPU 3     19694075554  19687914629

Rules:

1. Columns are named by the latest ``#Entity`` header (tags such as ``NVLTX``, ``PCITX``,
   ``SMACT``, mapped to DCGM field ids by :data:`TAGS`); a data line with no header in force
   uses the field ids of the latest ``dcgmi dmon ... -e IDS`` command line, if any.
2. Field ids map to canonical names and scales through :data:`collector.formats.dcgm.FIELDS_BY_ID`
   (the one conversion table); an unknown id is kept as ``dcgm_field_<id>``.
3. Sample blocks: a block ends when an entity already seen in it appears again, or at a new
   header or command line. Block k (counting from 0 over the whole file) is stamped
   ``ts_ns + k × delay``; delay is the command's ``-d`` (ms) when given, else dmon's default
   1 s. Lines reading ``...`` (elided output) are skipped and do not advance time.
4. dmon prints no UUID: rows get ``uuid = "gpu<N>"`` so the GPUs stay distinct series under
   the store key; join with dcgm-exporter rows on (host, gpu).
5. A cell that is not a plain number (``N/A``, an annotation such as ``123(1.2GB/s)``) is
   refused as a Problem naming the line and column; the other cells of the line are kept.
   Entities other than ``GPU N`` and lines with the wrong number of cells are refused whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.errors import Problem, quote
from collector.files import read_capped
from collector.formats import FileFormat, IngestContext, Parsed
from collector.formats.dcgm import FIELDS_BY_ID
from collector.records import frame

DEFAULT_DELAY_NS = 1_000_000_000
MAX_BYTES = 512 << 20  # a capture is read whole (its blocks carry state); past this it is refused

TAGS: dict[str, int] = {
    "SMCLK": 100,
    "MMCLK": 101,
    "MMTMP": 140,
    "TMPTR": 150,
    "POWER": 155,
    "PCIRP": 202,
    "GPUTL": 203,
    "MCUTL": 204,
    "XIDER": 230,
    "FBFRE": 251,
    "FBUSD": 252,
    "GRACT": 1001,
    "SMACT": 1002,
    "SMOCC": 1003,
    "TENSO": 1004,
    "DRAMA": 1005,
    "FP64A": 1006,
    "FP32A": 1007,
    "FP16A": 1008,
    "PCITX": 1009,
    "PCIRX": 1010,
    "NVLTX": 1011,
    "NVLRX": 1012,
}
_COMMAND = re.compile(r"dcgmi\s+dmon\b(.*)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_ENTITY = re.compile(r"(GPU)\s+(\d+)\s+(.*)")


@dataclass
class _Dmon:
    ts_ns: int
    host: str
    source: str
    fields: list[int] = field(default_factory=list)
    delay_ns: int = DEFAULT_DELAY_NS
    block: int = -1  # index of the current sample block (rule 3)
    in_block: set[int] = field(default_factory=set)
    pending: bool = True  # the next data line starts a new block
    rows: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def new_block(self) -> None:
        """The next data line starts a block (after a header or a command line)."""
        self.pending = bool(self.in_block) or self.pending

    def enter(self, gpu: int) -> None:
        """Rule 3: a GPU already in the current block starts the next one."""
        if self.pending or gpu in self.in_block:
            self.block += 1
            self.in_block = set()
            self.pending = False
        self.in_block.add(gpu)


def parse_dmon(text: str, *, ts_ns: int, host: str = "", source: str = "") -> Parsed:
    """``gpu_samples`` rows of one ``dcgmi dmon`` capture (see the module rules)."""
    st = _Dmon(ts_ns=ts_ns, host=host, source=source)
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line in ("ID", "...") or line.startswith("# "):
            continue
        command = _COMMAND.search(line)
        if command:
            _command(st, command.group(1))
        elif line.startswith("#Entity"):
            _header(st, lineno, line)
        else:
            _data(st, lineno, line)
    parsed = Parsed(problems=st.problems)
    parsed.add("gpu_samples", frame("gpu_samples", st.rows))
    return parsed


def _command(st: _Dmon, args: str) -> None:
    """Rules 1 and 3: ``-e`` ids and ``-d`` delay of a ``dcgmi dmon`` command line."""
    fields = re.search(r"-e\s+([\d,]+)", args)
    delay = re.search(r"-d\s+(\d+)", args)
    st.fields = [int(f) for f in fields.group(1).split(",") if f] if fields else []
    st.delay_ns = int(delay.group(1)) * 1_000_000 if delay else DEFAULT_DELAY_NS
    st.new_block()


def _header(st: _Dmon, lineno: int, line: str) -> None:
    tags = line.split()[1:]
    unknown = [t for t in tags if t not in TAGS]
    if unknown:
        st.problems.append(Problem(f"line {lineno}", f"unknown dmon column(s) {unknown}: {quote(line)}"))
    st.fields = [TAGS.get(t, -1) for t in tags]
    st.new_block()


def _data(st: _Dmon, lineno: int, line: str) -> None:
    m = _ENTITY.fullmatch(line)
    cells = m.group(3).split() if m else []
    if m is None or not st.fields or len(cells) != len(st.fields):
        why = "no column header or -e list in force" if m and not st.fields else "not a `GPU N value...` line"
        if m and st.fields:
            why = f"{len(cells)} cells for {len(st.fields)} columns"
        st.problems.append(Problem(f"line {lineno}", f"{why} (rule 5): {quote(line)}"))
        return
    gpu = int(m.group(2))
    st.enter(gpu)
    for column, (field_id, cell) in enumerate(zip(st.fields, cells, strict=True), 1):
        _cell(st, lineno, gpu, column, field_id, cell)


def _cell(st: _Dmon, lineno: int, gpu: int, column: int, field_id: int, cell: str) -> None:
    if not _NUMBER.fullmatch(cell):
        st.problems.append(
            Problem(f"line {lineno}", f"column {column}: not a number (rule 5): {quote(cell)}")
        )
        return
    if field_id < 0:
        return
    known = FIELDS_BY_ID.get(field_id)
    name, scale = (known.name, known.scale) if known else (f"dcgm_field_{field_id}", 1.0)
    st.rows.append(
        {
            "ts_ns": st.ts_ns + st.block * st.delay_ns,
            "host": st.host,
            "gpu": gpu,
            "uuid": f"gpu{gpu}",
            "metric": name,
            "link": -1,
            "value": float(cell) * scale,
            "source": st.source,
        }
    )


def sniff(name: str, head: bytes) -> bool:
    """A dmon capture: an ``#Entity`` header or a ``dcgmi dmon`` command, and ``GPU N`` lines."""
    text = head.decode("utf-8", errors="replace")
    has_header = "#Entity" in text or _COMMAND.search(text) is not None
    return has_header and re.search(r"(?m)^\s*GPU\s+\d+\s+\S", text) is not None


def load(path: Path, ctx: IngestContext) -> Parsed:
    name = ctx.name or path.name
    source = f"{ctx.source}:{name}" if ctx.source else name
    text = read_capped(path, MAX_BYTES).decode("utf-8", errors="replace")
    return parse_dmon(text, ts_ns=ctx.ts_ns, host=ctx.host, source=source)


FILE_FORMAT = FileFormat(name="dcgmi-dmon", sniff=sniff, load=load, priority=40)
