"""Pure diagnosis: a snapshot in, findings out.  No I/O, no clock, no torch."""

from gputop.diagnose.findings import CAUSES, SEVERITIES, Evidence, Finding

__all__ = ["CAUSES", "SEVERITIES", "Evidence", "Finding"]
