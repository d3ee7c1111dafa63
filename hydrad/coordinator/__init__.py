"""The coordinator: one daemon that routes OpenAI requests across engines and switches profiles.

Its pure parts (routing over an engine snapshot, profile resolution) import no plane, so the
bus, the front door and the console can share them and tests can drive them without sockets.
"""
