"""A C tool started now whose output is read later, while this process does other work.

The full observe runs `ipset save` and `iptables-save` (seconds at 10,000 services) and reads
IPVS itself: started first, the tools run on another CPU meanwhile. Their output goes to
unnamed temporary files, not pipes, so a long output never stops them while nobody reads.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence


class Started:
    """`argv` running from now on; wait() gives what subprocess.run would have given."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        # open until wait(): the command writes to them meanwhile
        self._out = tempfile.TemporaryFile()  # noqa: SIM115
        self._err = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._out,
                                          stderr=self._err)
        except BaseException:
            self._out.close()
            self._err.close()
            raise

    def wait(self) -> subprocess.CompletedProcess[str]:
        try:
            rc = self._proc.wait()
            self._out.seek(0)
            self._err.seek(0)
            return subprocess.CompletedProcess(self.argv, rc, self._out.read().decode(),
                                               self._err.read().decode(errors="replace"))
        finally:
            self._out.close()
            self._err.close()
