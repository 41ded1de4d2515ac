"""Exports for the cluster's own tools: gputop's figures and findings as Prometheus metrics.

``metrics`` is pure (figures and findings in, metric families out); ``prometheus``
serves them with prometheus-client, which is loaded only when asked for.
"""
