"""The fleet: the runs a cluster's Prometheus knows through gputop's job rules (``gputop fleet``)."""
