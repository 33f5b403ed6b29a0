"""Codec cost outside the serving loop: payloads, timing against one memcpy, delivery between processes."""
