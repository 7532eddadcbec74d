"""ipvsproxy: a Kubernetes service proxy that programs Linux IPVS over generic netlink."""

__version__ = "0.1.0"

from ipvsproxy import lean as _lean

_lean.install()  # pyroute2 and kubernetes without their whole top-level packages
