"""What gputop knows and does about processes: facts from /proc (``procfs``), a child that leaves when its
parent has (``lifeline``), and the dashboard's lower priority beside training (``yielding``).  Shared by the
reporter, the node sampler and the dashboard side: stdlib only, nothing loaded here."""
