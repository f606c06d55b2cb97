"""SGLang as the generation engine (``backends.generate: sglang``).

- :mod:`.buckets`: a version's weights as flattened buckets, one flat tensor per dtype
  (plain tensor code; what SGLang's flattened-bucket loader takes);
- :mod:`.versions`: which policy version each generated token was sampled under, across
  pauses, weight updates and resubmissions (plain bookkeeping);
- :mod:`.runner`: one engine, its event loop on a thread of its own, pause / update /
  continue around a new version;
- :mod:`.engine`: :class:`~.engine.SGLangDecoder`, the decoder surface over it, and the
  glue to ``sglang.Engine``, which is imported there and only when an engine starts.

SGLang needs a CUDA device; it is installed with ``pip install 'asyncrl[gpu]'``.
"""
