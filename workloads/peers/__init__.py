"""Peer libraries as methods: other tools a user would pick for the same task (JAX, Opacus, BackPACK).

Each peer module imports its library lazily, when a method is built, so a missing package makes
that method raise NotImplementedError with the reason (ASV: skipped; CLI: shown as skipped).
"""
