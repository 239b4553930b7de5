"""Every failure kiln expects is a KilnError: the CLI prints its message and exits non-zero.

Messages name the file, tensor or option at fault and say what to do about it.
"""


class KilnError(Exception):
    """Base class: a user-facing error with a complete message."""


class ModelFileError(KilnError):
    """The GGUF file is missing, foreign, truncated or uses something kiln does not support."""


class ArchitectureError(KilnError):
    """An architecture template is missing, malformed or inconsistent with the model."""


class OptionError(KilnError):
    """A compile or runtime option is out of range."""


class GraphError(KilnError):
    """A pass found the IR inconsistent (a compiler bug or a template/model mismatch)."""


class RegistryError(KilnError):
    """A bundled model could not be resolved, fetched or verified."""


class BuildError(KilnError):
    """The C compiler failed or is missing, or a build is for a CPU this one is not."""
