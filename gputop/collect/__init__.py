"""The dashboard side's I/O: collector server, GPU and host samplers, the mutable store, live and replay sources.

It fills the pure types of ``gputop.model``; it never imports the UI, the
diagnosis or torch.
"""
