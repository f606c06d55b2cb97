"""SGLang as the generation engine (``backends.generate: sglang``).

- :mod:`.buckets`: a version's weights as flattened buckets, one flat tensor per dtype
  (plain tensor code; what SGLang's flattened-bucket loader takes);
- :mod:`.versions`: which policy version each generated token was sampled under, across
  pauses, weight updates and resubmissions (plain bookkeeping);
- :mod:`.engine`: :class:`~.engine.SGLangDecoder`, the decoder surface over
  ``sglang.Engine``, which is imported there and only when an engine starts.

SGLang needs a CUDA device; it is installed with ``pip install 'asyncrl[gpu]'``.
"""
