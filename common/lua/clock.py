"""The Redis clock, read inside a script: every time a script compares comes from it."""

# Sets ``now`` to the Redis server's time in milliseconds.
NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
