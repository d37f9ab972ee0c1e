"""envbuild: reproducible GPU environments for LLM RL training, right for the GPU you have."""

__version__ = "0.1.0"
