"""megatron-core as the engine of train, logp and ref_logp (``backends.train=megatron``).

``mapping`` (pure tensor code) converts weights between Hugging Face's layout and
megatron's; ``model`` builds megatron's ``GPTModel`` from a model directory and presents
it to the learner and the scorers; ``logprobs`` computes log-probs over a vocabulary split
across tensor-parallel ranks. Only ``model`` imports megatron, and only this package
imports ``model``.
"""
