"""A waiting line with elapsed time: redrawn in place on a terminal, one line every 10 s otherwise
(so logs and CI output stay readable)."""

from __future__ import annotations

import time
from typing import TextIO

_SPIN = "|/-\\"


class Progress:
    def __init__(self, out: TextIO, what: str, every_s: float = 10.0):
        self.out, self.what, self.every_s = out, what, every_s
        self.t0 = self._last = time.monotonic()
        self._tty = bool(getattr(out, "isatty", lambda: False)())
        self._ticks = 0
        self._drawn = False

    def update(self) -> None:
        now = time.monotonic()
        self._ticks += 1
        if self._tty:
            self.out.write(f"\r{self.what} {_SPIN[self._ticks % 4]} {now - self.t0:.0f} s ")
            self.out.flush()
            self._drawn = True
        elif now - self._last >= self.every_s:
            self._last = now
            print(f"{self.what} ... {now - self.t0:.0f} s", file=self.out, flush=True)

    def close(self) -> None:
        if self._drawn:  # clear the in-place line; the caller prints the outcome
            self.out.write("\r\033[K")
            self.out.flush()
