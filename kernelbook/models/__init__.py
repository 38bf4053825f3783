"""The problems and the chapters' models: ``kb.problems``, ``kb.roofline``, ``kb.folding``, ``kb.coalescing``,
``kb.variance``, ``kb.gn_mean``, ``kb.tensorcore``, ``kb.training``, and ``kb.autograd_ops`` (the fused ops'
autograd, copied into the benchmark submissions)."""
