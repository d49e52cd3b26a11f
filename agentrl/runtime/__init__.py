"""Runtimes wire the parts together from a config: local (one process) or Ray (runtime/ray/)."""
