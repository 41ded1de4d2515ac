"""Bundled training scripts that reproduce each cause of low GPU utilization (``gputop demo``)."""
