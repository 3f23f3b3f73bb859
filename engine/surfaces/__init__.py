"""Streamer surfaces: WHIP ingest, WHEP and RTMP egress, the MQTT bus and chat queue, and the pages' API.

``register_surfaces(app, engine, peers)`` (in :mod:`engine.surfaces.routes`) wires them all into the
aiohttp app; every piece hangs off the engine's session hooks, so a session gets its chat queue,
media taps and MQTT topics when it is created and loses them when it closes.
"""
