"""The engine's side of the ZeroMQ bus (``link``); the messages it speaks live in
``hydrad.wire.messages``, the coordinator's side in ``hydrad.coordinator.bus``."""
