"""llama.cpp's own quantizer (`llama_model_quantize` in the libllama llama-cpp-python installs), so
that kiln's kernels are proven on the files users download, mixes of types and all, and not only on
blocks gguf.quants wrote.

The structs are declared here from include/llama.h (llama_model_quantize_params,
llama_model_imatrix_data), not taken from llama-cpp-python's bindings: a field they lag behind on
would shift every field after it without an error. The importance matrix is uniform (all ones):
the i-quants of 1 to 3 bits refuse to run without one, and a uniform one weights every column
alike, so the file depends on the weights alone.
"""
from __future__ import annotations

import ctypes
import threading
from collections import deque
from pathlib import Path

import llama_cpp
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

LIB_PATH = Path(llama_cpp.__file__).parent / "lib" / "libllama.so"

# name -> (LLAMA_FTYPE_MOSTLY_*, the ggml types the file must hold some tensor of). The second part
# is what the test asserts: the quantizer keeps the embeddings, the head and some layers in other
# types (a mix, as users download), but the type the ftype is named after must be in it.
FTYPES: dict[str, tuple[int, tuple[Q, ...]]] = {
    "Q8_0": (7, (Q.Q8_0,)),
    "Q2_K": (10, (Q.Q2_K,)),
    "Q3_K_S": (11, (Q.Q3_K,)),
    "Q3_K_M": (12, (Q.Q3_K,)),
    "Q3_K_L": (13, (Q.Q3_K,)),
    "Q4_K_M": (15, (Q.Q4_K,)),
    "IQ2_XXS": (19, (Q.IQ2_XXS,)),
    "IQ2_XS": (20, (Q.IQ2_XS,)),
    "IQ3_XXS": (23, (Q.IQ3_XXS,)),
    "IQ1_S": (24, (Q.IQ1_S,)),
    "IQ4_NL": (25, (Q.IQ4_NL,)),
    "IQ3_S": (26, (Q.IQ3_S,)),
    "IQ3_M": (27, (Q.IQ3_S,)),
    "IQ2_S": (28, (Q.IQ2_XS,)),  # llama.cpp's IQ2_S files are IQ2_XS tensors (and IQ3_S), ...
    "IQ2_M": (29, (Q.IQ2_S,)),  # ... and its IQ2_M files IQ2_S tensors
    "IQ4_XS": (30, (Q.IQ4_XS,)),
    "IQ1_M": (31, (Q.IQ1_M,)),
    "TQ1_0": (36, (Q.TQ1_0,)),
    "TQ2_0": (37, (Q.TQ2_0,)),
    "MXFP4_MOE": (38, (Q.MXFP4,)),
}
# the i-quants: given the uniform importance matrix (those of 1 to 3 bits refuse to run without one)
WITH_IMATRIX = {name for name in FTYPES if name.startswith("IQ")}
GGML_TYPE_COUNT = 43  # ggml.h's enum ggml_type at this llama.cpp: "leave the type to the ftype"


class QuantizeError(RuntimeError):
    pass


class ImatrixData(ctypes.Structure):  # struct llama_model_imatrix_data
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.POINTER(ctypes.c_float)), ("size", ctypes.c_size_t)]


class QuantizeParams(ctypes.Structure):  # llama_model_quantize_params
    _fields_ = [
        ("nthread", ctypes.c_int32),
        ("ftype", ctypes.c_int),  # enum llama_ftype
        ("output_tensor_type", ctypes.c_int),  # enum ggml_type
        ("token_embedding_type", ctypes.c_int),
        ("allow_requantize", ctypes.c_bool),
        ("quantize_output_tensor", ctypes.c_bool),
        ("only_copy", ctypes.c_bool),
        ("pure", ctypes.c_bool),
        ("keep_split", ctypes.c_bool),
        ("dry_run", ctypes.c_bool),
        ("imatrix", ctypes.POINTER(ImatrixData)),
        ("kv_overrides", ctypes.c_void_p),
        ("tt_overrides", ctypes.c_void_p),
        ("prune_layers", ctypes.POINTER(ctypes.c_int32)),
        ("max_buf_size", ctypes.c_size_t),
    ]


_LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_lib = ctypes.CDLL(str(LIB_PATH))  # the same handle llama_cpp opened: one llama.cpp in the process
_lib.llama_backend_init.restype = None
_lib.llama_log_set.argtypes, _lib.llama_log_set.restype = [_LOG_FN, ctypes.c_void_p], None
_lib.llama_model_quantize_default_params.restype = QuantizeParams
_lib.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(QuantizeParams)]
_lib.llama_model_quantize.restype = ctypes.c_uint32
_lib.llama_backend_init()

_log: deque[str] = deque(maxlen=200)
_log_lock = threading.Lock()  # one quantization at a time: the log callback is process-wide
_LOG = _LOG_FN(lambda level, text, user: _log.append(text.decode(errors="replace")))  # kept alive: C calls it


def quantizable(path: str | Path) -> dict[str, int]:
    """The tensors llama.cpp quantizes and each one's importance-matrix length: its input width
    (ne[0]) times its experts (ne[2]; 1 for a matrix), as llama-quant.cpp checks it. Left out, as
    in an imatrix llama-imatrix writes: 1-D tensors, norms, the router and token_embd (a row
    lookup, which llama-imatrix never sees)."""
    out = {}
    for t in GGUFReader(str(path)).tensors:
        ne = [int(n) for n in t.shape]
        if len(ne) < 2 or not t.name.endswith("weight") or "_norm.weight" in t.name:
            continue
        if "ffn_gate_inp" in t.name or t.name == "token_embd.weight":
            continue
        out[t.name] = ne[0] * (ne[2] if len(ne) > 2 else 1)
    return out


def quantize(src: str | Path, dst: str | Path, ftype: str, nthread: int = 2, imatrix: bool | None = None) -> Path:
    """Quantize the F16/F32 GGUF src to dst as llama-quantize would (`llama-quantize [--imatrix]
    src dst FTYPE`), with a uniform importance matrix for the i-quants (imatrix None) or as told."""
    if ftype not in FTYPES:
        raise QuantizeError(f"unknown ftype {ftype!r}: one of {', '.join(FTYPES)}")
    params = _lib.llama_model_quantize_default_params()
    params.nthread, params.ftype = nthread, FTYPES[ftype][0]
    if params.output_tensor_type != GGML_TYPE_COUNT or params.max_buf_size == 0:
        raise QuantizeError("llama_model_quantize_params does not read as include/llama.h declares it: "
                            f"output_tensor_type {params.output_tensor_type}, max_buf_size {params.max_buf_size}")
    keep = []
    if imatrix if imatrix is not None else ftype in WITH_IMATRIX:
        entries = quantizable(src)
        table = (ImatrixData * (len(entries) + 1))()
        for i, (name, size) in enumerate(entries.items()):
            ones = (ctypes.c_float * size)(*([1.0] * size))
            keep += [ones, name.encode()]
            table[i] = ImatrixData(keep[-1], ones, size)
        table[len(entries)] = ImatrixData(None, None, 0)  # the terminator llama.cpp looks for
        keep.append(table)
        params.imatrix = ctypes.cast(table, ctypes.POINTER(ImatrixData))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with _log_lock:  # the log is process-wide; llama.cpp's lines go to _log (quiet), kept for an error
        _log.clear()
        _lib.llama_log_set(_LOG, None)
        rc = _lib.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
        lines = list(_log)
    if rc != 0 or not Path(dst).is_file():
        errors = [ln.strip() for ln in lines if ln.strip()][-12:]
        raise QuantizeError(f"llama_model_quantize({src} -> {ftype}) returned {rc}; llama.cpp said:\n  "
                            + "\n  ".join(errors))
    return Path(dst)


def tensor_types(path: str | Path) -> dict[str, Q]:
    """Each tensor's type in a GGUF, by name."""
    return {t.name: Q(int(t.tensor_type)) for t in GGUFReader(str(path)).tensors}


def check_holds(path: str | Path, ftype: str) -> dict[str, Q]:
    """The file's tensor types, having checked that the types its ftype is named after are among them."""
    types = tensor_types(path)
    missing = [q.name for q in FTYPES[ftype][1] if q not in types.values()]
    if missing:
        raise QuantizeError(f"{path}: llama.cpp's {ftype} holds no {', '.join(missing)} tensor: "
                            + ", ".join(f"{n} {q.name}" for n, q in types.items()))
    return types


# The i-quants of 1 to 3 bits build their grids' neighbour tables the first time a process quantizes
# to them, seconds of one core each (IQ1_S's and IQ1_M's 2048-point grid the longest): the work is
# the same in any process, so the pool gives each family one process and runs them side by side.
FAMILY = {"IQ1_S": 0, "IQ1_M": 0, "IQ2_XXS": 1, "IQ2_XS": 1, "IQ2_S": 1, "IQ2_M": 1, "IQ3_XXS": 1, "IQ3_S": 1,
          "IQ3_M": 1}


class QuantizePool:
    """Quantize many (source, ftype) pairs in background processes, started at once: `get` waits for
    one, so a caller works on the files already made while the others are being made. Jobs keep the
    order given within each process, so list them in the order they are needed."""

    def __init__(self, root: Path, jobs: list[tuple[Path, str]], workers: int = 2):
        import json
        import subprocess
        import sys
        self.root, self.results, self.cond = Path(root), {}, threading.Condition()
        self.root.mkdir(parents=True, exist_ok=True)
        shares: list[list[tuple[str, str, str]]] = [[] for _ in range(workers)]
        for i, (src, ftype) in enumerate(jobs):
            w = FAMILY.get(ftype, i) % workers
            shares[w].append((str(src), ftype, str(self.dst(src, ftype))))
        self.procs = []
        for share in shares:
            if not share:
                continue
            # one thread each for quantizing: the processes already share the two cores
            p = subprocess.Popen([sys.executable, __file__, json.dumps(share)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            self.procs.append(p)
            threading.Thread(target=self._read, args=(p, share), daemon=True).start()

    def dst(self, src: str | Path, ftype: str) -> Path:
        return self.root / f"{Path(src).stem}-{ftype}.gguf"

    def _read(self, proc, share) -> None:
        import json
        for line in proc.stdout:
            r = json.loads(line)
            with self.cond:
                self.results[r["dst"]] = r
                self.cond.notify_all()
        err = proc.stderr.read()
        proc.wait()
        with self.cond:
            for _, ftype, dst in share:  # a worker that died leaves its jobs answered, not waited on forever
                self.results.setdefault(dst, {"dst": dst, "ok": False, "error":
                                              f"the quantizing process exited {proc.returncode}: {err[-2000:]}"})
            self.cond.notify_all()

    def get(self, src: str | Path, ftype: str, timeout: float = 600) -> Path:
        """The quantized file, once made, having checked it holds its ftype's types."""
        dst = str(self.dst(src, ftype))
        with self.cond:
            if not self.cond.wait_for(lambda: dst in self.results, timeout):
                raise QuantizeError(f"{src} -> {ftype}: not quantized after {timeout:.0f} s")
            r = self.results[dst]
        if not r["ok"]:
            raise QuantizeError(r["error"])
        check_holds(dst, ftype)
        return Path(dst)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _worker(jobs: list[tuple[str, str, str]]) -> None:
    import json
    import sys
    import time
    for src, ftype, dst in jobs:
        start = time.perf_counter()
        try:
            quantize(src, dst, ftype, nthread=1)
            r = {"dst": dst, "ok": True}
        except QuantizeError as e:
            r = {"dst": dst, "ok": False, "error": str(e)}
        r["seconds"] = round(time.perf_counter() - start, 2)
        sys.stdout.write(json.dumps(r) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    import json
    import sys
    _worker(json.loads(sys.argv[1]))
