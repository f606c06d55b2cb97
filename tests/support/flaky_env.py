"""A calculator environment that breaks on some problems, as buggy tools do: its step
raises for every problem whose answer ends in 7 (about one in ten)."""

from __future__ import annotations

from asyncrl.actors.tasks.calculator import Calculator


class BreaksOnSevens(Calculator):
    def step(self, action: str) -> tuple[str, float, bool]:
        if self.answer.endswith("7"):
            raise KeyError(f"no tool for {self.answer}")
        return super().step(action)
