"""Scripts that make what the package ships, run by hand from the repository's root:
warmup.py makes the embedded base models (``python -m tests.tools.warmup``)."""
