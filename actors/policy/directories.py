"""Where a model lives: the packaged models by name, and the directory ``model.path`` names.

Torch-free on purpose: roles that only read a model's files (the tokenizer, the chat
template, config.json) find them here without importing torch.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["EMBEDDED", "EMBEDDED_DIR", "PACKAGED", "model_dir", "packaged_or_path"]

EMBEDDED = "embedded"
EMBEDDED_DIR = Path(__file__).parent / "embedded"
# Models that ship inside the package, by the name model.path gives them.
PACKAGED = {
    EMBEDDED: EMBEDDED_DIR,
    "embedded-calculator": Path(__file__).parent / "embedded_calculator",
    "embedded-code": Path(__file__).parent / "embedded_code",
    "embedded-agent": Path(__file__).parent / "embedded_agent",
    "embedded-long": Path(__file__).parent / "embedded_long",
}


def model_dir(path: str) -> Path:
    """The directory ``model.path`` names; a clear error if it is not a model directory."""
    directory = packaged_or_path(path)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"model.path={path!r}: {directory} holds no config.json")
    return directory


def packaged_or_path(path: str) -> Path:
    """The directory of a packaged model's name, else ``path`` itself."""
    return PACKAGED.get(path) or Path(path).expanduser()
