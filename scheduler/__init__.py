"""Pure models of the kernel's IPVS schedulers. Imports nothing from ipvsproxy."""
