"""The Textual dashboard: ``run_dashboard(source)`` shows what a SnapshotSource sees.

Everything the UI shows is computed off the UI thread into an immutable
``DashboardView`` (``view.py``); widgets only turn that into text.
"""
