"""Hydra's binary operations on the merged RPC port: the wire codec (sans-IO) lives in ``protocol``."""
