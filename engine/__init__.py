"""idolcast engine: a real-time AI virtual idol, from the host's voice to her animated reply."""

from engine.native import quiet_thread_pools

__version__ = "0.1.0"

quiet_thread_pools()  # before any native library starts its threads: every entry point imports engine first
