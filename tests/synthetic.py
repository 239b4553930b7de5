"""The synthetic GGUF writer lives in the package (compiler/tools/synthetic.py); the tests import it from here."""
from compiler.tools.synthetic import TinySpec, llama3_rope_freqs, tensor_shapes, write_tiny_model  # noqa: F401
