"""schemathesis over the whole OpenAPI of ``ioe serve``'s app, with every check, many cases.

Run: ``.venv/bin/python -m bench.bench_schemathesis [--per-operation 80] [--token]``
(goal: at least 1,000 generated cases, every check clean).

The app is the real one (in-process ASGI) over the API tests' store (``tests/api_store.py``).
Each operation gets ``--per-operation`` generated requests (hypothesis, no database, no
deadline), validated with all of schemathesis' checks: no 5xx, documented status codes and
content types, response bodies matching their models, schema-valid requests accepted and
schema-invalid ones refused. Two operations take opaque bodies (an OTLP protobuf/JSON export, a
SQL text) that a schema cannot describe, so a schema-valid random body is rightly refused there:
for those two only ``positive_data_acceptance`` is not applied (as in ``tests/test_api_schema.py``).
With ``--token`` the app requires a bearer token and every case carries it.
Prints cases run, cases per operation and each failure found (none is the goal).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import schemathesis
from api_store import build
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance

from api.app import create_app
from ioe.settings import Settings

OPAQUE = {"/v1/traces": [positive_data_acceptance], "/api/v1/query": [positive_data_acceptance]}
TOKEN = "bench-schemathesis-token"


def _run_operation(op: object, examples: int, token: bool, cases: Counter[str]) -> list[str]:
    """``examples`` generated cases of one operation; the failure found, if any."""
    label = f"{op.method.upper()} {op.path}"  # type: ignore[attr-defined]

    @given(case=op.as_strategy())  # type: ignore[attr-defined]
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: schemathesis.Case) -> None:
        cases[label] += 1
        if token:
            case.headers["Authorization"] = f"Bearer {TOKEN}"
        case.call_and_validate(excluded_checks=OPAQUE.get(case.path, []))

    try:
        run()
    except Exception as exc:  # a failing check: record it and go on to the next operation
        return [f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"]
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-operation", type=int, default=80)
    ap.add_argument("--token", action="store_true", help="serve with a bearer token and send it")
    args = ap.parse_args(argv)
    store = build()
    app = create_app(Settings(store_path=":memory:", auth_token=TOKEN if args.token else ""), store)
    headers = {"Authorization": f"Bearer {TOKEN}"} if args.token else {}
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=headers)
    cases: Counter[str] = Counter()
    failures: list[str] = []
    start = time.perf_counter()
    for result in schema.get_all_operations():
        op = result.ok()  # type: ignore[union-attr]
        failures.extend(_run_operation(op, args.per_operation, args.token, cases))
    elapsed = time.perf_counter() - start
    store.close()
    for label, n in sorted(cases.items()):
        print(f"{n:5d}  {label}")
    print(
        f"{sum(cases.values())} cases over {len(cases)} operations in {elapsed:.0f} s; "
        f"{len(failures)} failing"
    )
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
