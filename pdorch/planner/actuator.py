"""What changes the fleet. The local actuator (pdorch/local_fleet.py) implements this protocol structurally."""

from __future__ import annotations

from typing import Protocol

ROLES = ("prefill", "decode")


class Actuator(Protocol):
    name: str  # "local", "kubernetes", "external"

    def current(self) -> dict[str, int]:
        """role -> replicas serving or starting (draining ones not counted)."""
        ...

    def apply(self, desired: dict[str, int]) -> None:
        """Converge each role to desired; returns promptly (a scale-down drains in the background)."""
        ...
