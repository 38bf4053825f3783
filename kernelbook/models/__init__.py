"""The problems and the chapters' models: ``kb.problems``, ``kb.roofline``, ``kb.folding``, ``kb.coalescing``,
``kb.variance``, ``kb.gn_mean``."""
