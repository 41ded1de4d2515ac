"""The dashboard driven through Textual's pilot and snapshots, from fixed data (tests/support/tui_fixtures.py)."""
