"""A reward model as the reward (``data.reward: model:DIR``): a Hugging Face sequence
classifier directory, loaded with ``AutoModelForSequenceClassification``.

It scores the text the policy saw and wrote, prompt then response, tokenized by the
classifier's own tokenizer (with its special tokens, truncated to its length). A model
with one label gives its logit as the reward (as reward models trained on preferences
do); one with two gives the probability of label 1. Needs transformers
(``pip install 'asyncrl[reward-model]'``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import Sample, TaskError

__all__ = ["ClassifierReward", "check_classifier_dir"]


def check_classifier_dir(path: str) -> Path:
    """The directory ``path`` names, if it could be a classifier; TaskError naming why
    not. Reads config.json only (a run checks this before anything starts)."""
    directory = Path(path).expanduser()
    where = f"data.reward='model:{path}'"
    try:
        import transformers  # noqa: F401 - only to say early that it is missing
    except ImportError:
        raise TaskError(
            f"{where}: needs transformers; pip install 'asyncrl[reward-model]'"
        ) from None
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise TaskError(f"{where}: {directory} holds no config.json")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise TaskError(f"{where}: config.json is not JSON: {error}") from None
    labels = _labels(config)
    if labels not in (1, 2):
        raise TaskError(
            f"{where}: the classifier has {labels} labels; a reward model has 1 (a score) "
            "or 2 (the probability of label 1 is the reward)"
        )
    return directory


class ClassifierReward:
    """``reward(sample, response)``: the classifier's score of prompt + response."""

    def __init__(self, path: str) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        directory = check_classifier_dir(path)
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
        self.labels = self.model.config.num_labels

    def __call__(self, sample: Sample, response: str) -> float:
        return self.batch(sample, [response])[0]

    def batch(self, sample: Sample, responses: list[str]) -> list[float]:
        """A group's responses in one forward pass, where padding cannot change a score:
        the model must know the tokenizer's pad id to find each row's last token."""
        import torch

        texts = [sample.prompt + response for response in responses]
        pad = self.tokenizer.pad_token_id
        if len(texts) > 1 and (pad is None or pad != self.model.config.pad_token_id):
            return [self.batch(sample, [response])[0] for response in responses]
        inputs = self.tokenizer(texts, return_tensors="pt", truncation=True, padding=True)
        with torch.inference_mode():
            logits = self.model(**inputs).logits.float()
        scores = logits[:, 0] if self.labels == 1 else logits.softmax(-1)[:, 1]
        return scores.tolist()


def _labels(config: dict[str, Any]) -> int:
    # transformers writes id2label, from which it derives num_labels; older files num_labels.
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    return int(config.get("num_labels", 2))
