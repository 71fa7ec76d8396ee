"""The analysis thresholds: defined in :mod:`ioeconf.thresholds` (below every layer, so the
settings object can carry them), re-exported here for the analyses and their callers."""

from ioeconf.thresholds import Thresholds

__all__ = ["Thresholds"]
