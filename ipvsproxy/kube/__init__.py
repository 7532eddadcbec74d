"""Reading the Kubernetes API: one consistent list (sync --once) and, later, watches."""
