"""``gputop mcp``: the live runs' figures and findings for a coding agent, over the Model Context Protocol.

``answers`` turns what the live chain computed into the tools' JSON (pure, no
SDK); ``server`` puts those answers behind the official ``mcp`` SDK on stdio.
The CLI (``gputop.cli.mcp``) starts the collector the way ``gputop attach``
does and hands the server its source.  Issue #25; docs/mcp.md.
"""
