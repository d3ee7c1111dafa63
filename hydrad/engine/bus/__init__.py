"""The ZeroMQ bus between the coordinator and the engines.

``messages`` holds the typed messages both ends share (and nothing that opens a socket), so
the engine side (``engine_link``) and the coordinator side (``hydrad.coordinator.bus``) never
import each other.
"""
