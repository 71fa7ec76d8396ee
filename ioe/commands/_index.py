"""Every ``ioe`` command's name, the module under :mod:`ioe.commands` that registers it, and the
first paragraph of its help, in the order ``ioe --help`` lists them.

``ioe --help`` (and ``-h``, and ``ioe`` alone) prints the command list from this table instead of
importing every command module (and with them polars, DuckDB, numpy and the web stack): 0.6 s
became the cost of importing typer. ``ioe NAME ...`` imports only NAME's module.
tests/test_cli_startup.py checks this table against the commands the modules register.
"""

from __future__ import annotations

COMMANDS: tuple[tuple[str, str, str], ...] = (
    (
        "demo",
        "demo",
        "Simulated deployments in different zones, the sidecar, the store, the analysis and the page.",
    ),
    (
        "estimate",
        "estimate",
        "Expected TTFT and TPOT (with the model terms) for a layout, or for every row of a CSV.",
    ),
    ("plan", "plan", "Rank TP/PP/DP/EP/attention-DP and P/D layouts by goodput per GPU within the SLOs."),
    (
        "serve",
        "serve",
        "Serve the REST API, OTLP/HTTP ingest, /metrics of verdicts and the page over a store.",
    ),
    (
        "sidecar",
        "sidecar",
        "Scrape GPU and engine metrics, read devices and NCCL logs, receive spans; write the store.",
    ),
    (
        "simulate",
        "simulate",
        "Serve simulated dcgm-exporter and vLLM endpoints; send spans; write NCCL Inspector logs.",
    ),
    (
        "ingest",
        "store_cmds",
        "Import captured files (format detected from content) and print rows stored per table.",
    ),
    ("query", "store_cmds", "Run read-only SQL over a store and print the result as CSV or JSON."),
    (
        "stragglers",
        "stragglers",
        "Find straggler ranks (arrival order tested per window with false-discovery control, persistent or\n"
        "intermittent) and name the likely cause from the GPU's telemetry.",
    ),
    (
        "trace-report",
        "trace_report",
        "Temporal breakdown, comm/comp overlap, kernel-type breakdown and arrival skew per rank.",
    ),
    ("analyze", "analyze", "Envelope zones, Cp, headroom and p99 regressions per deployment."),
)
