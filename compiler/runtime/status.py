"""A C status code (runtime_c/status.h) as a Python error that says what to do about it.

The codes come from the library (cffi reads the enum of KILN_STATUS_LIST); the messages here add
what only Python knows: which sequence, the pool's state, the option to change.
"""
from __future__ import annotations

from ..core.errors import KilnError


class ModelError(KilnError):
    """A call on a loaded model was refused (bad token or sequence, full context or pool, bad rollback, wrong weights)."""


class PoolFullError(ModelError):
    """The KV pool has too few free pages for the step; nothing was changed. A scheduler frees
    pages (evicts cached prefixes, preempts a sequence) and tries again."""


def status_error(m, status: int, seq, rows: int) -> ModelError:
    """The error for a status of the C instance `m` (instance.py), about `seq` (a Sequence, or None)."""
    lib, o = m.lib, m.options
    who = f"sequence {seq.id}" if seq is not None else "a sequence"
    windows = ", ".join(str(w) for w in sorted({w for w in m.windows if w}))

    def pool() -> str:
        s = m.kv_stats()
        return f"{s['pages_used']} of {s['pages_total']} pages of {o.page_size} positions in use"

    messages = {
        lib.KILN_E_ARG: lambda: "invalid argument",
        lib.KILN_E_TOKEN: lambda: f"token id out of range [0, {m.n_vocab})",
        lib.KILN_E_CTX_FULL: lambda: f"context full: the tokens do not fit in n_ctx={m.n_ctx} of {who}"
        + (f" (n_past={seq.n_past})" if seq is not None and not seq.closed else "")
        + "; reset(), rollback(), or compile with a larger ctx (--ctx)",
        lib.KILN_E_ROLLBACK: lambda: f"rollback beyond the positions {who} holds",
        lib.KILN_E_ROLLBACK_WINDOW: lambda: "rollback further back than the sliding-window layers' pages remember "
        f"(window {windows}): pages that left every window went back to the pool; reset() and prefill again",
        lib.KILN_E_OPEN: lambda: f"{m.path}: cannot open or map the weights file",
        lib.KILN_E_WEIGHTS: lambda: f"{m.path}: this is not the weights file the library was compiled for "
        f"(expected {m.spec.file_size:,} bytes and the same header); recompile for it",
        lib.KILN_E_NOMEM: lambda: "out of memory allocating the KV pool or the arena",
        lib.KILN_E_PACKED: lambda: f"{m.compiled.packed_path}: not the packed weights file for {m.path} "
        "(or unreadable); delete it and load again to rewrite it",
        lib.KILN_E_KV_FULL: lambda: f"the KV pool is out of pages ({pool()}): close or roll back sequences, "
        "or compile with more pages (kv_pages, --kv-pages)",
        lib.KILN_E_NO_SEQ: lambda: f"all {o.n_seq} sequences are open: close one, or compile with more (n_seq, --n-seq)",
        lib.KILN_E_SEQ: lambda: f"{who} is not open" + ("" if seq is None else "; open another with m.sequence()"),
        lib.KILN_E_BATCH: lambda: f"a step takes 1 to {o.batch_tokens} rows (batch_tokens, --batch-tokens), got {rows}",
        lib.KILN_E_SHIFT_WINDOW: lambda: f"the shift would make the sliding-window layers (window {windows}) read "
        "positions whose pages already left their window (the first positions, the sinks): keep fewer sinks, or "
        "discard fewer positions so that the window stays clear of them",
        lib.KILN_E_RECURRENT: lambda: f"{m.spec.arch} is a hybrid: its recurrent layers keep one state per sequence "
        "that holds every position at once, so positions cannot be dropped from it (a rollback to an earlier "
        "position, a context shift) or borrowed from another sequence's pages; reset() and prefill again, or fork() "
        "a sequence to continue it two ways",
    }
    text = messages[status]() if status in messages else m.ffi.string(lib.kiln_strerror(status)).decode()
    return (PoolFullError if status == lib.KILN_E_KV_FULL else ModelError)(text)
