"""Integrations with training frameworks that own the loop (Lightning, ...)."""
