"""idolcast engine: a real-time AI virtual idol, from the host's voice to her animated reply."""

__version__ = "0.1.0"
