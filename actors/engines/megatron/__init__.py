"""megatron-core as the engine of train, logp and ref_logp (``backends.train=megatron``).

- ``mapping``: weights between Hugging Face's layout and megatron's (pure tensor code, no
  megatron import);
- ``parallel``: megatron's weights split over tensor-, expert- and pipeline-parallel ranks,
  and merged back (pure tensor code too);
- ``gpt_build``: megatron's ``GPTModel`` of a model configuration, and its process groups;
- ``model``: that model as the learner and the scorers use one (token ids in, logits or
  log-probs out, weights and optimizer state by Hugging Face name), loaded from a model
  directory;
- ``hf_weights``: that model's weights by Hugging Face name, whole, to and from this
  rank's part of them;
- ``stage_links``: activations across pipeline stages as autograd functions;
- ``experts``: a mixture of experts' router and token dispatcher on any device;
- ``logprobs``: log-probs over a vocabulary split across tensor-parallel ranks;
- ``gathers``: the collectives that put a split state together;
- ``optimizer``: the distributed optimizer (AdamW's state split over data-parallel copies).

Nothing outside this package imports it but ``actors.startup.model_loading``
(``model.load_megatron``), and only when the config asks for megatron.
"""
