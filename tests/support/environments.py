"""Environment plug-ins that break the contract, for the checks before a run starts."""

from __future__ import annotations


class NoStep:
    def reset(self, sample) -> str:
        return sample.prompt


class LongStop:
    stop = ("+=",)  # two tokens of the embedded vocabulary

    def reset(self, sample) -> str:
        return sample.prompt

    def step(self, action: str):
        return "", 0.0, True


def refuses_to_be_made():
    raise RuntimeError("no licence for the tool")
