"""A truth set for IOE's zone verdicts that is not IOE's own model.

``physics`` (step costs from public peaks and the measured silicon curves), ``engine`` (one engine's
steady state per scrape interval), ``formats`` (dcgm-exporter, vLLM 0.33 and NCCL Inspector writers),
``scenarios`` / ``catalog`` (deployments with the expert's verdict) and ``render`` (a capture
directory ``ioe ingest`` reads). Nothing here imports IOE's packages (tests/test_truthgen.py checks).
"""
