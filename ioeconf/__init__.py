"""Settings types every layer shares: the one settings object (:mod:`ioeconf.settings`) and the
analysis thresholds (:mod:`ioeconf.thresholds`).

This package sits below ``collector/``, ``analyzer/``, ``api/`` and ``ioe/`` and imports none of
them (tests/test_import_direction.py), so each layer can take its settings without importing a
layer above it. ``ioe.settings`` and ``analyzer.thresholds`` re-export these names.
"""
