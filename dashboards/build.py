"""Write IOE's dashboards as JSON under ``dashboards/grafana/`` (``python -m dashboards.build``).

``--check`` writes nothing and exits 1 when a committed file differs from a fresh build (CI runs it through
``tests/test_dashboards_json.py``). Output is stable: keys sorted, two-space indent, trailing newline.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from dashboards.definitions import DASHBOARDS

OUT_DIR = Path(__file__).resolve().parent / "grafana"


def render(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def built() -> dict[str, str]:
    """File name -> JSON text for every dashboard."""
    return {name: render(make()) for name, make in DASHBOARDS.items()}


def stale(out_dir: Path = OUT_DIR) -> list[str]:
    """Names of committed files that are missing or differ from a fresh build."""
    return [
        n for n, text in built().items() if not (out_dir / n).exists() or (out_dir / n).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        bad = stale()
        print("stale: " + ", ".join(bad) if bad else "dashboards up to date")
        return 1 if bad else 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in built().items():
        (OUT_DIR / name).write_text(text)
        print(f"wrote {OUT_DIR / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
