"""Engines other than the built-in PyTorch model: SGLang for generation
(``backends.generate``), megatron-core for train, logp and ref_logp (``backends.train``).

Each engine is a package that imports its own library only when the engine is started,
so the default install never imports, or needs, any of them. An SGLang decoder has the
surface of :class:`asyncrl.actors.policy.decoder.Decoder`, so the generate role, episodes
and validation drive it the same way; a training engine's model meets
:class:`~asyncrl.actors.engines.contract.EngineModel` (contract.py), what the learner and
the scorers use. What a role of a training engine asks before it starts is answered in
one place, train_checks.py.
"""
