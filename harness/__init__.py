"""wirebench: what message serialization between an LLM API server and its engine costs."""

__version__ = "0.1.0"
