"""kiln: an ahead-of-time compiler from GGUF models to C for CPU inference."""
__version__ = "0.1.0"
