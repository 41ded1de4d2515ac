"""``gputop fleet``'s live view: the runs a cluster's Prometheus knows (``screen``), a node's own page
(``node_screen``), on the dashboard's shell (``gputop.tui.shell``)."""
