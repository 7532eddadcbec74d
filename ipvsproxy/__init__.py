"""ipvsproxy: a Kubernetes service proxy that programs Linux IPVS over generic netlink."""

__version__ = "0.1.0"
