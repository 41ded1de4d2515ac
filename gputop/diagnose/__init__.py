"""Pure diagnosis: a snapshot in, findings out.  No I/O, no clock, no torch.

``diagnose(snapshot, span_s=10.0)`` is stateless; ``Diagnoser`` adds the
persistence and hysteresis a live panel needs.  The rules, their thresholds
and sources are described in docs/diagnosis.md.
"""

from gputop.diagnose.engine import DEFAULT_SPAN_S, diagnose, worst_first
from gputop.diagnose.findings import CAUSES, SEVERITIES, Evidence, Finding
from gputop.diagnose.persistence import CLEAR_AFTER_UPDATES, SHOW_AFTER_UPDATES, Diagnoser

__all__ = [
    "CAUSES",
    "CLEAR_AFTER_UPDATES",
    "DEFAULT_SPAN_S",
    "SEVERITIES",
    "SHOW_AFTER_UPDATES",
    "Diagnoser",
    "Evidence",
    "Finding",
    "diagnose",
    "worst_first",
]
