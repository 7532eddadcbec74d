"""`python -m ipvsproxy`: the same entry point as the console script."""

import sys

from ipvsproxy.cli import main

sys.exit(main())
