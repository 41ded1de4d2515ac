"""What the tests share: fixed data, stand-ins for hardware and hosts, and real processes to test against.

The tiers (``tests/unit``, ``tests/tui``, ``tests/integration``) import from here, never from each other.
"""
