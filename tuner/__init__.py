"""specdec-tuner: find the fastest speculative-decoding setup for a vLLM deployment."""

__version__ = "0.1.0"
