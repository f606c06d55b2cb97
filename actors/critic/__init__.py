"""The learned critic of PPO: a value model on the policy's decoder, and its arithmetic."""

from .model import ValueModel, load_value_model, response_values

__all__ = ["ValueModel", "load_value_model", "response_values"]
