"""The daemon (`ipvsproxy run`): state store, reconciler loop, health, metrics."""
