"""The diagnosis rules, one module per family of causes.

Each rule is a pure function of the figures (``gputop.model.figures``: a run's
``RunFigures``, or the machine's ``Figures``) returning findings; none reads a
clock, a file or a socket.  ``gputop.diagnose.engine.diagnose`` runs them in order.
"""
