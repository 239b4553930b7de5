"""The synthetic GGUF writer lives in the package (compiler/tools/synthetic.py); the tests import it from here."""
from compiler.tools.synthetic import TinySpec, tensor_shapes, write_tiny_model  # noqa: F401
from compiler.tools.synthetic_features import llama3_rope_freqs  # noqa: F401
