"""The architecture of a Hugging Face causal LM, read from and written to ``config.json``.

Llama, Mistral, Qwen2, Qwen3 and Qwen3-MoE share one arithmetic (pre-norm decoder,
RMSNorm, rotary positions, SwiGLU MLP) and differ in a few switches: which projections
carry a bias, per-head RMSNorm on queries and keys (Qwen3 and Qwen3-MoE),
sliding-window attention (Mistral; the Qwens when enabled), rotary frequency scaling
(Llama 3.x) and a mixture of experts in place of every MLP (Qwen3-MoE). :class:`ModelConfig`
holds those switches. Any other field of ``config.json`` that would change the
arithmetic is refused with an error naming it: a model that silently computes something
else than its checkpoint was trained for is worse than one that does not load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["FAMILIES", "SUPPORTED_ARCHITECTURES", "Experts", "ModelConfig", "RopeScaling"]

# Architecture (config.json "architectures") → transformers' model_type.
FAMILIES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)

FULL, SLIDING = "full_attention", "sliding_attention"
_ROPE_TYPES = ("default", "linear", "llama3")
_QWEN = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
_QK_NORM = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
_MOE = ("Qwen3MoeForCausalLM",)


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling: ``linear`` (every frequency / factor) or ``llama3``
    (low frequencies / factor, high ones kept, a smooth blend between)."""

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def to_hf(self) -> dict[str, Any]:
        if self.rope_type == "linear":
            return {"rope_type": "linear", "factor": self.factor}
        return {
            "rope_type": "llama3",
            "factor": self.factor,
            "low_freq_factor": self.low_freq_factor,
            "high_freq_factor": self.high_freq_factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
        }


@dataclass(frozen=True)
class Experts:
    """A mixture of experts in place of every layer's MLP: a router (a linear layer without
    bias) scores ``count`` experts for each token, softmax over all of them; the
    ``per_token`` best compute (each a SwiGLU MLP of ``intermediate_size``) and their
    outputs are summed, weighted by those probabilities, renormalised over the chosen
    ones when ``normalize`` (Qwen3-MoE's ``norm_topk_prob``)."""

    count: int
    per_token: int
    intermediate_size: int
    normalize: bool

    def __post_init__(self) -> None:
        if self.count < 1 or self.intermediate_size < 1:
            raise ValueError(
                f"experts: num_experts={self.count} and moe_intermediate_size="
                f"{self.intermediate_size} must be at least 1"
            )
        if not 1 <= self.per_token <= self.count:
            raise ValueError(
                f"experts: num_experts_per_tok={self.per_token} must be between 1 and "
                f"num_experts={self.count}"
            )


@dataclass(frozen=True)
class ModelConfig:
    """The architecture fields of a Hugging Face ``config.json`` that this model reads.

    ``attention_bias`` means what the family's transformers class makes of it: q/k/v/o
    biases for Llama and Qwen3, q/k/v biases for Qwen2 (always on there), none for Mistral.
    ``layer_types`` is empty when every layer attends to everything before it.
    ``experts`` is set for a mixture-of-experts model (Qwen3-MoE), whose every layer has
    one in place of the MLP (``intermediate_size`` is then unused).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool = False  # Llama only
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    experts: Experts | None = None

    def __post_init__(self) -> None:
        _check_switches(self)

    @property
    def output_bias(self) -> bool:
        """Whether o_proj has a bias (Llama and Qwen3 tie it to attention_bias; Qwen2 not)."""
        return self.attention_bias and self.architecture != "Qwen2ForCausalLM"

    @property
    def qk_norm(self) -> bool:
        """Whether queries and keys are RMS-normed per head before rotary (Qwen3)."""
        return self.architecture in _QK_NORM

    def lowest_layers(self, layers: int) -> ModelConfig:
        """This architecture with its lowest ``layers`` decoder layers only (each keeping
        its own attention kind): a smaller model of the same weights' lower part."""
        if not 1 <= layers <= self.num_hidden_layers:
            raise ValueError(f"{layers} of {self.num_hidden_layers} decoder layers")
        return replace(self, num_hidden_layers=layers, layer_types=self.layer_types[:layers])

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (keys it sees, itself included), None: all."""
        if self.architecture == "MistralForCausalLM":
            return self.sliding_window  # every layer, when set
        if self.layer_types and self.layer_types[layer] == SLIDING:
            return self.sliding_window
        return None

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        """The architecture of a ``config.json``; ValueError naming a field we can't honour."""
        try:
            return cls._read(config)
        except KeyError as missing:
            raise ValueError(f"config.json lacks {missing.args[0]}") from None

    @classmethod
    def _read(cls, config: dict[str, Any]) -> ModelConfig:
        arch = _architecture(config)
        _refuse_unimplemented(config)
        heads = config["num_attention_heads"]
        layers = config["num_hidden_layers"]
        window, layer_types = _sliding(config, arch, layers)
        return cls(
            architecture=arch,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=_head_dim(config, arch),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(config),
            max_position_embeddings=config["max_position_embeddings"],
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            attention_bias=_attention_bias(config, arch),
            mlp_bias=arch == "LlamaForCausalLM" and bool(config.get("mlp_bias", False)),
            rope_scaling=_rope_scaling(config),
            sliding_window=window,
            layer_types=layer_types,
            experts=_experts(config, arch),
        )

    def to_hf(self) -> dict[str, Any]:
        """A ``config.json`` that transformers loads as the same class with the same math."""
        common = {
            "architectures": [self.architecture],
            "model_type": FAMILIES[self.architecture],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            # rope_theta + rope_scaling: the form transformers 4.x reads and 5.x converts.
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling.to_hf() if self.rope_scaling else None,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
        }
        return common | self._family_fields()

    def _family_fields(self) -> dict[str, Any]:
        if self.architecture == "LlamaForCausalLM":
            return {"attention_bias": self.attention_bias, "mlp_bias": self.mlp_bias}
        if self.architecture == "MistralForCausalLM":
            return {"sliding_window": self.sliding_window}
        types = list(self.layer_types) or [FULL] * self.num_hidden_layers
        sliding = [i for i, kind in enumerate(types) if kind == SLIDING]
        fields = {
            "use_sliding_window": bool(sliding),
            "sliding_window": self.sliding_window,
            # Older transformers derive the layer types from this; newer read layer_types.
            "max_window_layers": sliding[0] if sliding else self.num_hidden_layers,
            "layer_types": types,
        }
        if self.architecture in _QK_NORM:
            fields["attention_bias"] = self.attention_bias
        if self.experts is not None:
            fields |= {
                "num_experts": self.experts.count,
                "num_experts_per_tok": self.experts.per_token,
                "moe_intermediate_size": self.experts.intermediate_size,
                "norm_topk_prob": self.experts.normalize,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
            }
        return fields


# --- reading config.json ---------------------------------------------------------------


def _architecture(config: dict[str, Any]) -> str:
    archs = config.get("architectures") or []
    arch = next((a for a in archs if a in FAMILIES), None)
    if arch is None:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        raise ValueError(f"config.json architectures={archs}: supported are {supported}")
    model_type = config.get("model_type", FAMILIES[arch])
    if model_type != FAMILIES[arch]:
        # transformers picks the class by model_type: it would build something else.
        raise ValueError(
            f"config.json model_type={model_type!r} does not match architectures={archs} "
            f"(expected {FAMILIES[arch]!r})"
        )
    return arch


def _refuse_unimplemented(config: dict[str, Any]) -> None:
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # transformers' "swish" is SiLU too
        raise ValueError(f"config.json hidden_act={act!r} is not supported (only silu)")
    if config.get("quantization_config"):
        raise ValueError("config.json quantization_config: quantized checkpoints are not supported")
    if config.get("attention_dropout", 0.0):
        # Real checkpoints of these families ship 0.0; we never drop attention weights.
        raise ValueError(
            f"config.json attention_dropout={config['attention_dropout']} is not supported "
            "(only 0.0)"
        )


def _head_dim(config: dict[str, Any], arch: str) -> int:
    if config.get("head_dim"):
        return config["head_dim"]
    if arch in _QK_NORM:
        return 128  # Qwen3Config's default, not hidden_size / heads
    return config["hidden_size"] // config["num_attention_heads"]


def _attention_bias(config: dict[str, Any], arch: str) -> bool:
    if arch == "Qwen2ForCausalLM":
        return True  # Qwen2's q/k/v always carry biases; the class reads no field for it
    if arch == "MistralForCausalLM":
        return False  # Mistral's projections never do
    return bool(config.get("attention_bias", False))


def _rope_fields(config: dict[str, Any]) -> dict[str, Any]:
    # transformers 4.x writes rope_scaling (null for plain rotary), 5.x rope_parameters.
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(scaling, dict) or (scaling and not _is_flat(scaling)):
        raise ValueError(f"config.json rope_scaling={scaling!r}: per-layer rotary is not supported")
    return scaling


def _is_flat(scaling: dict[str, Any]) -> bool:
    return not any(isinstance(value, dict) for value in scaling.values())


def _rope_theta(config: dict[str, Any]) -> float:
    scaling = _rope_fields(config)
    return float(config.get("rope_theta") or scaling.get("rope_theta") or 10000.0)


def _rope_scaling(config: dict[str, Any]) -> RopeScaling | None:
    scaling = _rope_fields(config)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in _ROPE_TYPES:
        supported = ", ".join(_ROPE_TYPES)
        raise ValueError(f"config.json rope_scaling rope_type={kind!r}: supported are {supported}")
    partial = scaling.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"config.json partial_rotary_factor={partial} is not supported (only 1.0)")
    if kind == "default":
        return None
    try:
        if kind == "linear":
            return RopeScaling("linear", float(scaling["factor"]))
        return RopeScaling(
            "llama3",
            float(scaling["factor"]),
            float(scaling["low_freq_factor"]),
            float(scaling["high_freq_factor"]),
            int(
                scaling.get("original_max_position_embeddings") or config["max_position_embeddings"]
            ),
        )
    except KeyError as missing:
        raise ValueError(f"config.json rope_scaling ({kind}) lacks {missing.args[0]}") from None


def _sliding(config: dict[str, Any], arch: str, layers: int) -> tuple[int | None, tuple[str, ...]]:
    """The sliding window and the per-layer attention kinds, as transformers derives them."""
    given = config.get("layer_types")
    if arch == "LlamaForCausalLM":
        derived, window = [FULL] * layers, None  # Llama reads no sliding_window
    elif arch == "MistralForCausalLM":
        window = config.get("sliding_window")  # on every layer when set
        derived = [SLIDING if window is not None else FULL] * layers
    else:  # Qwen2, Qwen3: sliding only when use_sliding_window, from max_window_layers on
        window = config.get("sliding_window") if config.get("use_sliding_window") else None
        first = config.get("max_window_layers", 28)
        derived = [SLIDING if window is not None and i >= first else FULL for i in range(layers)]
    types = list(given) if given is not None and arch in _QWEN else derived
    if given is not None and list(given) != types:
        # Llama and Mistral classes ignore layer_types; alternating layers are other classes.
        raise ValueError(
            f"config.json layer_types={given} is not what {arch} computes ({types[0]}, ...)"
        )
    if len(types) != layers or set(types) - {FULL, SLIDING}:
        raise ValueError(
            f"config.json layer_types={given}: expected {layers} of {FULL!r}/{SLIDING!r}"
        )
    if SLIDING in types and not isinstance(window, int):
        raise ValueError(
            "config.json layer_types has sliding_attention layers but no sliding_window "
            "(use_sliding_window is false or sliding_window is null)"
        )
    if arch == "MistralForCausalLM":
        return window, ()  # no per-layer kinds: the window applies to every layer
    if SLIDING not in types:
        return None, ()
    return window, tuple(types)


def _experts(config: dict[str, Any], arch: str) -> Experts | None:
    if arch not in _MOE:
        return None
    # transformers 5 writes num_local_experts where 4.x wrote num_experts.
    count = config.get("num_experts") or config.get("num_local_experts")
    if not count:
        raise ValueError(f"config.json of {arch} lacks num_experts")
    if config.get("decoder_sparse_step", 1) != 1 or config.get("mlp_only_layers"):
        raise ValueError(
            f"config.json decoder_sparse_step={config.get('decoder_sparse_step', 1)}, "
            f"mlp_only_layers={config.get('mlp_only_layers')}: dense MLP layers between "
            "the sparse ones are not supported (only 1 and [])"
        )
    if config.get("shared_expert_intermediate_size"):
        raise ValueError(
            "config.json shared_expert_intermediate_size: shared experts are not supported"
        )
    return Experts(
        count=count,
        per_token=config["num_experts_per_tok"],
        intermediate_size=config["moe_intermediate_size"],
        # Qwen3MoeConfig's default; the released checkpoints set it true.
        normalize=bool(config.get("norm_topk_prob", False)),
    )


# --- consistency of a ModelConfig built in code ------------------------------------------


def _check_switches(c: ModelConfig) -> None:
    if c.architecture not in FAMILIES:
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        raise ValueError(f"architecture={c.architecture!r}: supported are {supported}")
    if c.architecture == "Qwen2ForCausalLM" and not c.attention_bias:
        raise ValueError("attention_bias=False: Qwen2ForCausalLM always has q/k/v biases")
    if c.architecture == "MistralForCausalLM" and c.attention_bias:
        raise ValueError("attention_bias=True: MistralForCausalLM has no attention biases")
    if c.mlp_bias and c.architecture != "LlamaForCausalLM":
        raise ValueError(
            f"mlp_bias=True: only LlamaForCausalLM has MLP biases, not {c.architecture}"
        )
    if c.num_attention_heads % c.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads={c.num_attention_heads} is not a multiple of "
            f"num_key_value_heads={c.num_key_value_heads}"
        )
    if (c.experts is not None) != (c.architecture in _MOE):
        raise ValueError(
            f"experts={c.experts}: only {', '.join(_MOE)} has (and needs) a mixture of experts"
        )
    _check_sliding(c)
    if c.rope_scaling is not None and not math.isfinite(c.rope_scaling.factor):
        raise ValueError(f"rope_scaling factor={c.rope_scaling.factor} is not a number")


def _check_sliding(c: ModelConfig) -> None:
    if c.layer_types and c.architecture not in _QWEN:
        raise ValueError(f"layer_types: {c.architecture} has no per-layer attention kinds")
    if c.sliding_window is not None and c.architecture == "LlamaForCausalLM":
        raise ValueError("sliding_window: LlamaForCausalLM has no sliding-window attention")
    if c.layer_types and len(c.layer_types) != c.num_hidden_layers:
        raise ValueError(f"layer_types has {len(c.layer_types)} entries for {c.num_hidden_layers}")
    sliding = SLIDING in c.layer_types or c.architecture == "MistralForCausalLM"
    if sliding and c.sliding_window is not None and c.sliding_window < 1:
        raise ValueError(f"sliding_window={c.sliding_window}: expected a window >= 1")
    if SLIDING in c.layer_types and c.sliding_window is None:
        raise ValueError("layer_types has sliding_attention layers but sliding_window is None")
