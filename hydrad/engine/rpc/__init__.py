"""The engine's merged RPC port: Hydra's binary operations (``server``) and the ggml-RPC relay; the codec (sans-IO) is ``hydrad.wire.protocol``."""
