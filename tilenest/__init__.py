"""tilenest: the executable, formally checked reference of the Tile DSL
execution-nest calculus.

The public DSL lives in this namespace (``import tilenest as tn``)::

    @tn.kernel
    def add(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):
        (n,) = x.shape
        for p in tn.parallel(tn.shape(tn.cdiv(n, 128))):
            o = tn.coord(p.index() * 128)
            y(o, tn.shape(128)).store(x[o, tn.shape(128)] + 1.0)
"""

from . import errors
from .tracebacks import api_boundary
from .frontend.dsl import (Axis, Index, Shape, Tile, assume, axis, bitcast, bounds, broadcast,
                           cast, cdiv, coord, dim, dims, exec, fold_left, fold_right, full,
                           gather, if_, index_tile, iota, ite, layout, map, matmul, mem, memory,
                           mma, ordered_tree, per, permute, pipeline, pipeline_policy, put,
                           parallel, reduce, reindex, reshape, scalar, serial, shape, sym,
                           unordered_tree, while_, zeros)
from .frontend.functions import *  # noqa: F401,F403  (elementwise functions)
from .frontend.functions import __all__ as _fn_all
from .frontend.kernel import Kernel, Scalar, Sym, Tensor, kernel
from .frontend.library import argmax, cumsum, reducer, scan, sort, topk
from .semantics.dtypes import (bf16, bool_, f8e4m3fn, f8e5m2, f16, f32, f64, i8, i16, i32,
                               i64, u8, u16, u32, u64)
from .semantics.ir import TileProgram
from .semantics.policies import MmaPolicy, PipelinePolicy, ReductionPolicy
from .proofs import transform  # noqa: F401  (tn.transform: transforms and their obligations)

__version__ = "0.1.0"


def _bound(program_or_kernel, arrays: tuple, kw: dict) -> tuple:
    """A call's arguments in signature order: a Kernel takes tensors and scalars
    by position or by name and compile-time constants by name (a specialized
    variant); a bare TileProgram takes them by position only."""
    if isinstance(program_or_kernel, Kernel):
        return program_or_kernel.bind_arguments(arrays, kw)
    return program_or_kernel, arrays, kw


@api_boundary
def interpret(program_or_kernel, *arrays, **kw):
    """Run a kernel (or a TileProgram) on the reference interpreter; calling a
    kernel, ``kernel(x, y)``, does the same. Tensors are the caller's arrays,
    written in place; returns the tensors the program stores to (one array,
    or a tuple in argument order).

    A kernel takes its tensors and scalars by position or by name and its
    compile-time constants by name (``interpret(gemm, a, b, c, bm=64)`` runs
    the variant specialized for ``bm=64``); a TileProgram takes its arguments
    by position. Keyword options:

    * ``params`` -- a dict binding the symbolic parameters that no array
      shape determines (a kernel also takes them by name);
    * ``schedule`` -- the order of ``parallel`` children: ``None`` (all in
      lockstep, the default), ``'canonical'``, ``'reversed'``,
      ``tn.interpreter.random(seed)`` or ``'random:SEED'``, or
      ``'exhaustive'`` (every order of every small region; a result that
      depends on the order is an error). Any other value is an error;
    * ``fast`` -- evaluate reassociating operations in BLAS or pairwise
      order (a result the contract admits, not the canonical one);
    * ``check_races`` (default True) -- log the effects of ``parallel``
      children and raise ``RaceError`` on a conflict;
    * ``poison`` -- fill the stored-only outputs (or those named in
      ``outputs``) with NaN or a sentinel first and report a read of an
      element nothing wrote;
    * ``check_pipelines`` (default True) -- report a pipeline whose result
      relies on an order its dependences do not give;
    * ``batch`` (default True) -- evaluate the iterations of a ``reduce`` region together where
      that is exactly equivalent (False: one by one, the same results, slower).

    A mistake in the call (a dtype, a rank, an extent, an unknown keyword)
    raises a ``TilenestError`` located at the caller's line."""
    from .interpreter import interpret as _interpret

    target, args, opts = _bound(program_or_kernel, arrays, kw)
    return _interpret(target, *args, **opts)


@api_boundary
def reference(program_or_kernel, *arrays, **kw):
    """The admitted outputs of a call: for each tensor the program stores to,
    an ``Admitted`` set (one, or a tuple in argument order) whose
    ``admits(candidate)`` returns a ``Verdict``. The arrays passed are not
    modified. Arguments bind as for ``interpret``.

    Keyword options: ``params``, ``schedule`` (the order of the reference
    run; every schedule admits the same set for a race-free program, and
    ``'exhaustive'`` first checks that the result does not depend on the
    order), ``poison``, ``outputs`` and ``batch`` as for ``interpret``;
    ``trees`` -- a compiled kernel's ``trees`` (the fixed trees it evaluates
    its custom-contract reductions in), so that those reductions are judged
    by the tree the compiled code used."""
    from .interpreter import reference as _reference

    trees = kw.pop("trees", None)
    target, args, opts = _bound(program_or_kernel, arrays, kw)
    return _reference(target, *args, trees=trees, **opts)


@api_boundary
def validate(kernel, target: str = "llvm", inputs=None, **kw):
    """Translation validation of ``kernel`` compiled for ``target`` against the
    reference (see ``tilenest.validation.validate``); returns a Report."""
    from .validation import validate as _validate

    return _validate(kernel, target, inputs=inputs, **kw)


@api_boundary
def tune(kernel, *arrays, target: str = "cuda", **kw):
    """The fastest schedule of ``kernel`` for ``target`` among a search of
    schedule overrides: each candidate legal, validated against the oracle
    on generated calls, and timed on the GPU on copies of this call's arrays
    (see ``tilenest.backends.cuda.tune``); returns a report whose
    ``compiled`` is the chosen kernel. A target is tuned when its registry
    row names a tuner (``tilenest.targets``: ``cuda``)."""
    import importlib

    from . import targets as _targets

    row = _targets.TARGETS.get(target)
    if row is None or row.tuner is None:
        from .errors import NotAvailableError

        tuned = [n for n, t in _targets.TARGETS.items() if t.tuner is not None]
        raise NotAvailableError(f"no tuner for target '{target}'",
                                hint=f"tune(kernel, *arrays, target='{tuned[0]}')" if tuned
                                else "no target has a tuner")
    return importlib.import_module(row.tuner).tune(kernel, *arrays, **kw)


def clear_cache(disk: bool = False, release: bool = True) -> int:
    """Forget this process's compiled kernels (llvm and cuda), NVRTC results
    and legality verdicts, and with ``release`` (the default) give their
    memory back to the system (a garbage collection, which takes about a
    second in a large process); kernels a caller still holds keep working.
    With ``disk=True`` also delete the persistent cache's entries (``*.tnc``
    under ``$TILENEST_CACHE_DIR``, default ``~/.cache/tilenest``). Returns
    the number of disk entries deleted."""
    import sys

    from .backends import kernelcache, llvm

    llvm.clear_cache(release=False)
    if "tilenest.backends.cuda" in sys.modules:  # nothing of cuda to forget otherwise
        sys.modules["tilenest.backends.cuda"].clear_cache(release=False)
    if release:
        kernelcache.release_memory()
    if not disk:
        return 0
    from .diskcache import cache_root

    root, n = cache_root(), 0
    for f in root.rglob("*.tnc") if root is not None and root.is_dir() else ():
        f.unlink(missing_ok=True)
        n += 1
    return n


@api_boundary
def parse(text: str, file: str | None = None, kernel: str | None = None) -> TileProgram:
    """The one kernel of TileIR text, as a verified TileProgram. A text of
    several kernels (what ``tilenest show`` prints for a file of several) needs
    ``kernel=NAME`` to pick one, or is read whole with :func:`parse_module`."""
    from .semantics.parser import parse_program

    return parse_program(text, file, kernel)


@api_boundary
def parse_module(text: str, file: str | None = None):  # type: ignore[no-untyped-def]
    """Every kernel of TileIR text, in order, verified: a ``TileModule``
    (iterate it, index it by position or kernel name, ``str()`` prints it)."""
    from .semantics.parser import parse_module as _parse_module

    return _parse_module(text, file)


__all__ = [
    "errors", "Axis", "Index", "Shape", "Tile", "assume", "axis", "bitcast", "bounds",
    "broadcast", "cast", "cdiv", "coord", "dim", "dims", "exec", "fold_left", "fold_right",
    "full", "gather", "if_", "index_tile", "iota", "ite", "layout", "map", "matmul", "mem",
    "memory", "mma", "ordered_tree", "per", "permute", "pipeline", "pipeline_policy", "put",
    "parallel", "reduce", "reindex", "reshape", "scalar", "serial", "shape", "sym",
    "unordered_tree", "while_", "zeros", "Kernel", "Scalar", "Sym", "Tensor", "kernel",
    "argmax", "cumsum", "reducer", "scan", "sort", "topk", "bf16", "bool_", "f8e4m3fn",
    "f8e5m2", "f16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "TileProgram", "MmaPolicy",
    "PipelinePolicy", "ReductionPolicy", "interpret", "reference", "validate", "parse",
    "parse_module", "clear_cache",
    *_fn_all,
]

#: subpackages reachable as ``tn.NAME`` without importing them up front
#: (``tn.interpreter.random(seed)``, ``tn.lowering.default_schedule``...)
_LAZY_SUBPACKAGES = ("interpreter", "lowering", "backends", "validation", "workloads",
                     "conformance", "proofs")


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``tn.interpreter`` and the other subpackages, imported on first use."""
    if name in _LAZY_SUBPACKAGES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tilenest' has no attribute {name!r}")
