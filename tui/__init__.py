"""hydra-console: a terminal console for a Hydra pool (engines, loads, profiles, routing)."""
