"""``hydractl``'s commands by subject (engine, kv, coordinator) and the clients they share."""
