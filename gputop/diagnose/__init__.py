"""Pure diagnosis: figures in, findings out.  No I/O, no clock, no torch.

``diagnose(summarize(snapshot))`` is stateless; ``Diagnoser`` adds the
persistence and hysteresis a live panel needs.  The rules, their thresholds
and sources are described in docs/diagnosis.md.
"""

from gputop.diagnose.engine import diagnose, worst_first
from gputop.diagnose.findings import CAUSES, SEVERITIES, Cause, Evidence, Finding, Severity
from gputop.diagnose.persistence import CLEAR_AFTER_S, SHOW_AFTER_S, Diagnoser

__all__ = [
    "CAUSES",
    "CLEAR_AFTER_S",
    "SEVERITIES",
    "SHOW_AFTER_S",
    "Cause",
    "Diagnoser",
    "Evidence",
    "Finding",
    "Severity",
    "diagnose",
    "worst_first",
]
