"""Streamer surfaces: WHIP ingest, WHEP and RTMP egress, the MQTT bus and chat queue, and the pages' API.

``register_surfaces(app, engine, peers)`` (in :mod:`engine.surfaces.routes`, called by engine/app.py) wires
them into the aiohttp app; a session gets its chat queue and MQTT topics from the engine's session hooks
when it is created and loses them when it closes. Its media it has from birth: WHEP viewers and RTMP read
taps of the session's own tracks (engine/transport/taps.py). engine.server never imports this package.
"""
