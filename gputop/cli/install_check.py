"""Whether the unrelated ``gputop`` from PyPI shares this environment, and what to do about it.

This project is distributed as ``gputop-train``; on PyPI the name ``gputop`` is an
unrelated GPU monitor whose wheel ships ``gputop/__init__.py``, ``gputop/cli.py``
and a ``gputop`` command.  Installed in one environment, the two write the same
files: whichever came last owns them, and ``pip uninstall gputop`` deletes files
that gputop-train needs (docs/packaging.md).  The check reads installed metadata
only (no network, no import of the other project), so the command can run it at
every start.
"""

from __future__ import annotations

import importlib.metadata

OTHER_NAME = "gputop"
THIS_NAME = "gputop-train"
# This project's summary.  Before its rename it was installed as "gputop" too (in
# contributors' editable installs); that one is not the unrelated project.
THIS_SUMMARY_START = "See why your GPUs sit idle"
FIX = f"pip uninstall -y {OTHER_NAME} {THIS_NAME} && pip install {THIS_NAME}"


def other_gputop() -> str | None:
    """One line naming the unrelated ``gputop`` installed here and the fix, or None when there is none."""
    for dist in importlib.metadata.distributions(name=OTHER_NAME):
        if _field(dist, "Summary").startswith(THIS_SUMMARY_START):
            continue
        version = _field(dist, "Version") or "?"
        return (
            f"the unrelated '{OTHER_NAME}' {version} from PyPI is installed here too and shares the gputop/ folder"
            f" with {THIS_NAME}: `pip uninstall {OTHER_NAME}` would delete files of this one. Fix: {FIX}"
        )
    return None


def _field(dist: importlib.metadata.Distribution, name: str) -> str:
    """A metadata field, or "" where the distribution's metadata lacks it."""
    metadata = dist.metadata
    return (metadata[name] or "") if name in metadata else ""
