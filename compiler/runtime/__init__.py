"""Running a compiled model from Python: Model and Sequence, generation, sampling, KV files."""
from .api import load, load_options
from .constraints import Constraint, ConstraintError, DeadEnd
from .model import Model
from .sequence import Sequence
from .status import ModelError, PoolFullError
from .topology import default_threads

__all__ = ["Constraint", "ConstraintError", "DeadEnd", "Model", "ModelError", "PoolFullError", "Sequence",
           "default_threads", "load", "load_options"]
