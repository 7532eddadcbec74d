"""`python -m ipvsproxy`: the same entry point as the console script."""

from ipvsproxy.cli import entry

entry()
