"""Errors shared across layers: a stage can refuse its configuration without importing engine.config."""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration value was refused; the message names the file, key and expectation."""
