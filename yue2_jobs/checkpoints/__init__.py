"""Checkpoint versions: the registry, validation, and the watchdog that activates them."""
