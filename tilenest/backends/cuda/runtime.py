"""Calling a CUDA kernel: on an NVIDIA GPU, or on the host emulator.

:class:`CudaKernel` binds a call like every compiled target
(``backends/calls.py``) and runs the phases one after another, each a launch
of its ``__global__`` function with ``programs`` blocks of ``threads``
threads and the dynamic shared memory its layout needs for these symbol
values. After each launch a nonzero status word raises the error it encodes.
Values that cross a phase boundary live in scratch buffers allocated for the
call (``calls.scratch_arrays``; on a GPU copied to the device with the
other host arrays), passed after the caller's arguments.

Devices (``device=``):

* ``"emulated"`` -- the generated CUDA source itself compiled as host C++
  (``backends/simt/emulator.py``: threads as fibers, shared memory poisoned
  before every block); ``policy``, ``seed`` and ``poison`` choose the thread
  interleaving and the poison. Needs no GPU.
* ``"gpu"`` -- the NVRTC cubin loaded with the CUDA driver (through CuPy);
  host arrays (numpy, torch CPU tensors...) are copied to the device and the
  written ones back, device arrays (CuPy, torch CUDA tensors, any DLPack
  array on the current CUDA device) are used in place (``tilenest/semantics/arrays.py``).

A launch never truncates: a block count above the grid limit, or dynamic
shared memory above the device's opt-in limit, is an error naming the sizes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ...semantics import arrays as A
from ...errors import TilenestError, user_site
from ...semantics import expr as E
from ...semantics.signature import order_arguments, stored_tensors
from ..calls import ArgumentBinder, scratch_arrays, status_error
from ...targets import CUDA as _CUDA_ROW

_CUDA = _CUDA_ROW.profile

#: most blocks of a 1-D grid
MAX_BLOCKS = 2**31 - 1
#: the dynamic shared memory a Hopper block may opt in to, and what it gets
#: without the opt-in (the cuda row's profile, tilenest.targets)
MAX_SHARED = _CUDA.shared_bytes
STATIC_SHARED = _CUDA.static_shared_bytes

_EMU_LOCK = threading.Lock()


def gpu_available() -> bool:
    """Whether a CUDA device can be used here (CuPy and a driver with a GPU)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


class CudaKernel(ArgumentBinder):
    """A kernel compiled for ``cuda``: call it like the interpreter (arrays
    written in place; returns the tensors it stores to). ``source`` is the
    CUDA C++, ``cubin`` the NVRTC sm_90a binary, ``resources`` the ptxas
    report per ``__global__`` function."""

    def __init__(self, program: Any, kernel: Any, schedule: Any, source: Any, built: Any,
                 device: str, obligations: list, compile_seconds: float, *,
                 lower: Callable[[], Any] | None = None):
        from ..kernelcache import CallFacts

        self.program = program
        #: what a call needs of the loop IR (``kernel`` may be these facts
        #: alone, for a kernel read from the disk cache; then ``lower`` gives
        #: the loop IR when something asks for it)
        self.facts = CallFacts.of(kernel)
        self._kernel = None if isinstance(kernel, CallFacts) else kernel
        self._lower = lower
        #: ``"disk"`` for a kernel read from the disk cache, else None
        self.cached: str | None = None
        self.schedule = schedule
        self.source = source
        self.built = built
        self.device = device
        self.obligations = obligations
        self.compile_seconds = compile_seconds
        self.stored = stored_tensors(program)
        self._emu: Any = None
        self._mod: Any = None
        self._calls = 0
        #: the launch precondition of the resource obligations (checked per call)
        self.precondition: Any = None
        #: reduce op id -> the fixed tree (``semantics.trees.BlockTree``) the
        #: kernel evaluates that custom-contract reduction in (validation
        #: passes it to the reference)
        self.trees: dict = {}
        #: the precondition of 32-bit index code (``index.width``); None when
        #: nothing needs checking (64-bit code, or proved for every size)
        self.index_precondition: Any = None
        self._index_fits: dict[tuple[int, ...], bool] = {}

    @property
    def kernel(self) -> Any:
        """The SIMT-form loop IR kernel (lowered again on first access for a
        kernel read from the disk cache; calls never need it)."""
        if self._kernel is None:
            if self._lower is None:
                raise TilenestError("internal: this compiled kernel has no loop IR")
            self._kernel = self._lower()
        return self._kernel

    @property
    def nbytes(self) -> int:
        """Bytes of the artifacts this kernel holds (cubin, PTX, source, log):
        what it counts for in the in-memory cache's bound."""
        b = self.built
        return len(b.cubin) + len(b.ptx or "") + len(b.log) + len(self.source.text)

    @property
    def cubin(self) -> bytes:
        return self.built.cubin

    @property
    def resources(self) -> Any:
        return self.built.resources

    @property
    def interleavings(self) -> tuple[dict, ...] | None:
        """On the emulator: the keyword arguments of one call under each
        thread interleaving policy (each with another poison), for callers
        that run a case under all of them; ``None`` on a GPU."""
        if self.device != "emulated":
            return None
        from ..simt.emulator import POISONS, POLICIES

        return tuple({"policy": p, "poison": POISONS[i % len(POISONS)], "seed": i}
                     for i, p in enumerate(POLICIES))

    def warnings(self) -> list[str]:
        """Reported compile warnings (register spills)."""
        return list(self.built.warnings())

    def __repr__(self) -> str:
        return f"<compiled {self.program.name} for cuda ({self.device})>"

    def variant(self, aliases: tuple[tuple[str, ...], ...],
                strided: tuple[str, ...] = (), index_bits: int | None = None,
                tma: bool | None = None) -> "CudaKernel":
        """This kernel compiled for a call whose parameters alias as ``aliases``
        (no ``__restrict__`` on them; legality checked with each group as one
        tensor), whose ``strided`` parameters are strided views, with
        ``index_bits`` of index arithmetic and bulk tensor copies per ``tma``
        (default: this kernel's; without them no ring is warp-specialized,
        ``Schedule.warp_roles``)."""
        from . import compile_program

        tma = self.schedule.tma if tma is None else tma
        s = self.schedule.with_(aliases=aliases, strided=strided,
                                index_bits=index_bits or self.schedule.index_bits,
                                tma=tma, warp_roles=self.schedule.warp_roles and tma)
        return compile_program(self.program, s, device=self.device)

    def maps_fit(self, keep: list, syms: dict[str, int]) -> bool:
        """Whether this call's arrays and sizes meet the tensor maps'
        encoding preconditions (``tensormaps.fits``; a host array bound for
        the GPU is copied to an aligned device array first)."""
        if not self.source.maps:
            return True
        from .tensormaps import fits

        env = {E.Sym(s): int(syms[s]) for s in self.facts.syms}
        return all(fits(m, _address(keep[m.arg], self.device), m.extents(env))
                   for m in self.source.maps)

    def index_fits(self, syms: dict[str, int]) -> bool:
        """Whether this kernel's index arithmetic is exact for a call with these
        sizes (the ``index.width`` precondition of 32-bit code; remembered
        per size tuple). A call where it fails runs the 64-bit variant."""
        pc = self.index_precondition
        if pc is None:
            return True
        key = tuple(int(syms[s]) for s in self.facts.syms)
        fits = self._index_fits.get(key)
        if fits is None:
            if len(self._index_fits) >= 256:
                self._index_fits.clear()
            fits = self._index_fits[key] = pc.holds(dict(zip(self.facts.syms, key)))
        return fits

    def arguments(self, arrays: tuple) -> tuple:
        """The call's arguments as the kernel reads them: on a GPU, device arrays
        as cupy arrays in place and host arrays as numpy views (copied per
        launch); on the emulator, every tensor as a numpy view."""
        if self.device == "gpu":
            return A.cuda_arguments(self.program, arrays, self.stored)
        return A.host_arguments(self.program, arrays, self.stored)

    # -- device arrays -------------------------------------------------------------------
    def bound(self, *arrays: Any, params: dict[str, int] | None = None) -> "BoundLaunch":
        """The launches of a call on device arrays (CuPy, a torch CUDA tensor,
        any DLPack array on the current CUDA device, or anything with
        ``__cuda_array_interface__``), bound once: ``.launch()`` enqueues every
        phase on the current stream without waiting (for timing and repeated
        calls), ``.check()`` waits and raises the error of a nonzero status.
        Shapes and dtypes are checked as for any call; arrays must be
        C-contiguous; nothing is copied."""
        from ...semantics.signature import bind_call

        if self.device != "gpu":
            raise TilenestError("bound launches run on a GPU", hint="compile with device='gpu'")
        import cupy as cp

        p = self.program
        arrays = A.cuda_arguments(p, arrays, self.stored)
        metas, dev = [], []
        for v, a in zip(p.args, arrays, strict=True):
            if hasattr(a, "__cuda_array_interface__"):
                if not a.flags.c_contiguous:
                    raise TilenestError(f"argument '{v.name}' is not C-contiguous",
                                        user_site() or p.loc, "pass cupy.ascontiguousarray(x)")
                metas.append(A.stand_in(a))
                dev.append(a)
            else:
                metas.append(a)
                dev.append(None)
        env = bind_call(p, tuple(metas), params)
        syms = {k.name: int(v) for k, v in env.items()}
        fits, maps = self.index_fits(syms), self.maps_fit(
            [d if d is not None else m for m, d in zip(metas, dev, strict=True)], syms)
        if not fits or not maps:
            return self.variant(self.schedule.aliases, self.schedule.strided,
                                None if fits else 64, None if maps else False
                                ).bound(*arrays, params=params)
        keep = []
        for v, a, d in zip(p.args, metas, dev, strict=True):
            if d is not None:
                keep.append(d)
            else:
                from ...semantics.numerics import constant

                arr = np.array(constant(a, v.type.dtype), dtype=v.type.dtype.np).reshape(1)
                keep.append(cp.asarray(A.as_bits(arr)))
        keep += scratch_arrays(self.facts, len(keep), syms, cp.zeros)
        return BoundLaunch(self, keep, syms)

    # -- execution -------------------------------------------------------------------
    def __call__(self, *arrays: Any, params: dict[str, int] | None = None,
                 policy: str | None = None, seed: int | None = None, poison: str | None = None,
                 **named: Any) -> Any:
        """Run the kernel. On the emulator, ``policy``/``seed``/``poison`` pick
        the interleaving and the poison; left out, successive calls rotate
        through every policy and poison (call ``n`` uses policy ``n mod 4``,
        poison ``n mod 3`` and seed ``n``), so repeated validation runs each."""
        if self.device == "emulated":
            from ..simt.emulator import POISONS, POLICIES

            n = self._calls
            self._calls += 1
            policy = policy or POLICIES[n % len(POLICIES)]
            poison = poison or POISONS[n % len(POISONS)]
            seed = n if seed is None else seed
        arrays, params = order_arguments(self.program, arrays, named, params)
        keep, syms = self.bind(arrays, params)
        groups, strided = self.aliases(keep), self.strided(keep)
        fits = self.index_fits(syms)
        maps = self.maps_fit(keep, syms)
        if (groups != self.schedule.aliases or strided != self.schedule.strided or not fits
                or not maps):
            return self.variant(groups, strided, None if fits else 64, None if maps else False)(
                *arrays, params=params, policy=policy, seed=seed, poison=poison)
        k = self.facts
        keep = keep + scratch_arrays(k, len(keep), syms)
        symvals = [int(syms[s]) for s in k.syms]
        for info, n, smem in self.launches(syms):
            status = np.zeros(1, dtype=np.int32)
            if self.device == "emulated":
                self._launch_emulated(info, n, smem, keep, symvals, status, policy, seed, poison)
            else:
                self._launch_gpu(info, n, smem, keep, symvals, status)
            if status[0]:
                raise status_error(self.program, k, int(status[0]))
        outs = [a for v, a in zip(self.program.args, arrays, strict=True)
                if v.name in self.stored]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def launches(self, syms: dict[str, int], check: bool = True) -> list[tuple[Any, int, int]]:
        """``(kernel info, blocks, dynamic shared bytes)`` of every launch a call
        with these symbol values makes, in order (phases with no programs left
        out). With ``check`` the launch precondition (O-13) is checked first,
        and a grid above :data:`MAX_BLOCKS` or shared memory above
        :data:`MAX_SHARED` is an error, never a truncated launch."""
        k = self.facts
        if check and self.precondition is not None:
            self.precondition.check({s: int(syms[s]) for s in k.syms})
        env = {E.Sym(s): int(syms[s]) for s in k.syms}
        out = []
        for info in self.source.kernels:
            n = int(E.evaluate(info.programs, env))
            if n <= 0:
                continue
            if info.grid_cap is not None:  # grid-stride blocks: each runs several programs
                n = min(n, info.grid_cap)
            smem = int(E.evaluate(info.shared_bytes, env))
            if check and n > MAX_BLOCKS:
                raise TilenestError(f"{info.name}: {n} programs exceed the grid limit "
                                    f"{MAX_BLOCKS}", self.program.loc,
                                    "split the top-level parallel domain")
            if check and smem > MAX_SHARED:
                raise TilenestError(
                    f"{info.name}: the program's shared buffers need {smem} bytes for these "
                    f"sizes, above the {MAX_SHARED} a block can have", self.program.loc,
                    "use smaller tiles per program (the shared-capacity obligation states "
                    "the sizes that fit)")
            out.append((info, n, smem))
        return out

    def launch_args(self, keep: list, symvals: list[int], status: Any, conv: Any) -> list:
        """The launch arguments of every phase (the ABI of ``emit.py``): the
        kernel's global buffers in argument order (bool elements as bytes,
        each through ``conv``), one ``int64`` per symbol, the status word."""
        args = []
        at: dict[int, int] = {}
        for b in sorted(self.facts.globals, key=lambda b: b.arg):
            a = keep[b.arg]
            a = a.reshape(-1) if a.ndim == 0 else a  # numpy, or cupy on a GPU
            if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
                a = A.span(a)  # a strided view: the memory from its first element on
            if a.dtype == np.bool_:
                a = a.view(np.uint8)  # bool elements are bytes (emit.mem)
            args.append(conv(a))
            at[b.arg] = _address(args[-1], self.device)
        args += [np.int64(v) for v in symvals]
        args.append(conv(status))
        return args + self.map_args(at, symvals)

    def map_args(self, at: dict[int, int], symvals: list[int]) -> list:
        """The encoded tensor maps of a call (``tensormaps.py``; ``at``: the
        base address of each tensor argument as the kernel sees it)."""
        if not self.source.maps:
            return []
        from .tensormaps import map_arguments

        env = {E.Sym(s): v for s, v in zip(self.facts.syms, symvals, strict=True)}
        out = map_arguments(self.source.maps, at, env, self.device == "gpu")
        if out is None:
            raise TilenestError("internal: a call whose tensor maps cannot be encoded reached "
                                "a kernel with bulk copies")
        return out

    def _launch_emulated(self, info: Any, n: int, smem: int, keep: list, symvals: list[int],
                         status: Any, policy: str, seed: int, poison: str) -> None:
        from ..simt import emulator

        if self._emu is None:
            with _EMU_LOCK:
                if self._emu is None:
                    from . import prelude_dirs

                    self._emu = emulator.build(
                        self.source.text, {i.name: list(i.params) for i in self.source.kernels},
                        include_dirs=prelude_dirs())
        # a read-only array reaching here is an input the kernel only reads (bind
        # refused read-only outputs by name): the emulator types its pointer as
        # mutable, so it is handed a writeable alias of the same memory
        args = self.launch_args(keep, symvals, status, A.input_alias)
        args = [a if not isinstance(a, np.int64) else int(a) for a in args]
        self._emu.launch(info.name, (n, 1, 1), (info.threads, 1, 1), args, shared_bytes=smem,
                         policy=policy, seed=seed, poison=poison)

    def _launch_gpu(self, info: Any, n: int, smem: int, keep: list, symvals: list[int],
                    status: Any) -> None:
        import cupy as cp

        if self._mod is None:
            self._mod = _load_cubin(self.cubin, [i.name for i in self.source.kernels])
        fn = self._mod[info.name]
        if smem > STATIC_SHARED:
            fn.max_dynamic_shared_size_bytes = smem
        dev: list = []
        back: list = []

        def conv(a: Any) -> Any:
            if isinstance(a, np.ndarray):
                a = A.as_bits(a)  # CuPy lacks the FP8 dtypes: their bits travel
                d = cp.asarray(a) if a.size else cp.zeros(1, dtype=a.dtype)
                dev.append(d)
                back.append((a, d))
                return d
            return a

        args = self.launch_args(keep, symvals, status, conv)
        fn((n,), (info.threads,), tuple(args), shared_mem=smem)
        cp.cuda.Device().synchronize()
        for host, d in back:
            if host.size and host.flags.writeable:
                host[...] = cp.asnumpy(d).reshape(host.shape)


def _address(a: Any, device: str) -> int:
    """The base address of array ``a`` as a kernel on ``device`` sees it: a
    device array's own; a host array's on the emulator, and 0 (aligned) on a
    GPU, where it is copied to a fresh device array."""
    if isinstance(a, np.ndarray):
        return a.ctypes.data if device != "gpu" else 0
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    return int(a.data.ptr)


def _load_cubin(cubin: bytes, names: list[str]) -> Any:
    """A CuPy module of ``cubin`` with the functions ``names`` loaded (the
    module reads its file lazily, so the functions are fetched before the
    temporary file goes)."""
    import os
    import tempfile

    import cupy as cp

    fd, path = tempfile.mkstemp(suffix=".cubin")
    with os.fdopen(fd, "wb") as f:
        f.write(cubin)
    try:
        mod = cp.RawModule(path=path)
        return {n: mod.get_function(n) for n in names}
    finally:
        os.unlink(path)


class BoundLaunch:
    """A call of a :class:`CudaKernel` on device arrays, ready to enqueue."""

    def __init__(self, ck: CudaKernel, keep: list, syms: dict[str, int]):
        import cupy as cp

        self.ck = ck
        k = ck.facts
        plan = ck.launches(syms)
        self.status = cp.zeros(1, dtype=np.int32)
        if ck._mod is None:
            ck._mod = _load_cubin(ck.cubin, [i.name for i in ck.source.kernels])
        args = []
        for b in sorted(k.globals, key=lambda b: b.arg):
            a = keep[b.arg]
            args.append(a.view(cp.uint8) if a.dtype == np.bool_ else a)
        args += [np.int64(syms[s]) for s in k.syms]
        args.append(self.status)
        args += ck.map_args({b.arg: _address(keep[b.arg], "gpu") for b in k.globals},
                            [int(syms[s]) for s in k.syms])
        self.steps = []
        for info, n, smem in plan:
            fn = ck._mod[info.name]
            if smem > STATIC_SHARED:
                fn.max_dynamic_shared_size_bytes = smem
            self.steps.append((fn, n, info.threads, smem))
        self.args = tuple(args)

    def launch(self) -> None:
        for fn, n, threads, smem in self.steps:
            fn((n,), (threads,), self.args, shared_mem=smem)

    def check(self) -> None:
        import cupy as cp

        cp.cuda.Device().synchronize()
        code = int(self.status.get()[0])
        if code:
            raise status_error(self.ck.program, self.ck.facts, code)
