"""The dashboard's widgets; each turns part of a ``DashboardView`` into text."""
