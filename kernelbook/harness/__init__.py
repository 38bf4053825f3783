"""The bench: build, check, time, profile and record kernels (``kb.build``, ``kb.check``, ...)."""
