"""Screens pushed over the dashboard: a rank's detail, and help."""
