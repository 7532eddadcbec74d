"""Root conftest: makes the checkout importable and loads the kernel-lab bridge."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest_plugins = ["integration.vm.pytest_lab"]
