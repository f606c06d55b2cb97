"""Generation engines other than the built-in PyTorch decoder.

Each engine is a package whose decoder has the surface of
:class:`asyncrl.actors.policy.decoder.Decoder`, so the generate role, episodes and
validation drive it the same way. An engine's own library is imported only when the
engine is started: nothing here needs it to be installed.
"""
