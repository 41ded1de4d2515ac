"""The diagnosis rules, one module per family of causes.

Each rule is a pure function of the digested facts (``gputop.diagnose.context``)
returning findings; none reads a clock, a file or a socket.
"""
