"""Arrays from any framework: what a call's tensor arguments may be, and how
each entry point sees them.

A tensor argument is an *array*: a numpy array, anything that speaks DLPack
(``__dlpack__`` and ``__dlpack_device__``: torch, cupy, jax, numpy itself),
or an object with the buffer protocol (``memoryview(x)`` works: ``bytearray``,
``array.array``...). The rules, the same at every entry point:

* **Zero-copy or an error, never a silent copy.** An array is used through a
  view of the caller's own memory. Where no view is possible -- the array lives
  on another device than the entry point runs on, DLPack refuses the export
  (a torch tensor that requires grad, a dtype numpy has no view of), or the
  layout is one a compiled target does not read -- the call is a
  :class:`~tilenest.errors.TilenestError` naming the argument, with a hint
  that says which explicit copy to make.
* **Outputs are written in place** in the caller's array: writing through the
  view changes the torch tensor, the cupy array, the ``bytearray``. An array
  that cannot be written -- a read-only numpy array or buffer, and every jax
  array (jax arrays are immutable) -- may be passed for a tensor the kernel
  only reads; passed for one it writes, it is an error.
* **Where each entry point runs.** The interpreter, the ``llvm`` target and the
  CUDA emulator run on the host (:func:`host_arguments`): a host array is
  viewed as numpy (``np.from_dlpack`` or the buffer protocol), a device array
  is an error. The ``cuda`` target on a GPU (:func:`cuda_arguments`) uses a
  device array (cupy, a torch CUDA tensor, any DLPack array whose device is
  CUDA, ``__cuda_array_interface__``) in place as a cupy array, which must be
  on the current device; host arrays are viewed as numpy and copied to the
  device and back by the runtime, as numpy arrays always were.
* numpy arrays pass through unchanged, so their checks and messages
  (``semantics/signature.py``: dtype, rank, extents, read-only outputs) are
  the same whether or not this module is involved; the other arrays reach
  those checks as the numpy (or cupy) views made here.

Runtime scalar arguments are numbers; a 0-d host array that speaks DLPack (a
torch or jax scalar tensor) is viewed like any array and read as its value.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from ..errors import Site, TilenestError, user_site

#: DLPack device types (``DLDeviceType``) whose memory the host reads directly
HOST_DEVICES = {1: "cpu", 3: "cuda_host", 11: "rocm_host"}
#: DLPack device types the ``cuda`` target uses in place
CUDA_DEVICES = {2: "cuda", 13: "cuda_managed"}
#: names of the other DLPack device types, for messages
OTHER_DEVICES = {4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi", 10: "rocm", 12: "ext_dev",
                 14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia"}

#: what to say when an object is not an array at all
ARRAY_KINDS = ("a numpy array, or an array that speaks DLPack (torch, cupy, jax) or the "
               "buffer protocol")


def describe(a: Any) -> str:
    """A short name of ``a``'s type for messages (``torch.Tensor``, ``jax.Array``)."""
    if is_immutable(a):
        return "jax.Array"
    t = type(a)
    root = t.__module__.split(".")[0]
    return t.__name__ if root == "builtins" else f"{root}.{t.__name__}"


def is_immutable(a: Any) -> bool:
    """Whether ``a`` is an array its framework never lets anyone write (a jax
    array), whatever flags a view of it carries."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(a, jax.Array)


def dlpack_device(a: Any, name: str = "the array") -> tuple[int, int] | None:
    """``(DLPack device type, device id)`` of an array that speaks DLPack,
    ``None`` for other objects. An array that cannot say where it lives (a
    torch tensor on the ``meta`` device, which has no data; a producer whose
    device query fails or answers nonsense) is a TilenestError naming the
    argument ``name``."""
    if isinstance(a, np.ndarray) or not hasattr(a, "__dlpack__"):
        return None
    if getattr(a, "is_meta", False) is True:
        raise TilenestError(
            f"argument '{name}' is a {describe(a)} on the meta device, which holds no "
            "elements", None,
            "meta tensors carry only a shape and a dtype; pass a tensor with data, e.g. "
            "torch.zeros_like(x, device='cpu')")
    dev = getattr(a, "__dlpack_device__", None)
    if dev is None:
        return (1, 0)  # a producer without a device query exports host memory
    try:
        kind, ident = dev()
        return int(kind), int(ident)
    except Exception as e:  # noqa: BLE001 - a foreign object's device query
        raise TilenestError(
            f"argument '{name}': its {describe(a)} does not say which device it lives on "
            f"(__dlpack_device__ gave {type(e).__name__}: {e})", None,
            _export_hint(a)) from None


def device_name(dev: tuple[int, int]) -> str:
    """``cuda:0``, ``cpu``, ``metal:0``..."""
    kind, ident = dev
    name = {**HOST_DEVICES, **CUDA_DEVICES, **OTHER_DEVICES}.get(kind, f"device type {kind}")
    return name if kind == 1 else f"{name}:{ident}"


def host_view(a: Any, name: str, written: bool, site: Site | None = None) -> Any:
    """``a`` as a numpy array sharing its memory, for an entry point running on
    the host; a numpy array is returned as it is. ``written``: the kernel
    stores to this argument. Raises for objects that are not arrays, arrays on
    a device, and exports DLPack refuses (see the module docstring)."""
    if isinstance(a, np.ndarray):
        return a
    if isinstance(a, np.generic):  # a numpy scalar is a number, not an array
        raise TilenestError(f"argument '{name}' must be an array, got {describe(a)}", site,
                            f"pass {ARRAY_KINDS}")
    if written and is_immutable(a):
        raise _immutable_output(a, name, site)
    dev = dlpack_device(a, name)
    if dev is not None:
        if dev[0] not in HOST_DEVICES:
            raise TilenestError(
                f"argument '{name}' is a {describe(a)} on {device_name(dev)}, but this entry "
                "point runs on the host", site,
                "copy it to the host yourself (torch: x.cpu(), cupy: cupy.asnumpy(x)) and "
                "copy results back, or compile for target='cuda' with device='gpu', which "
                "uses device arrays in place")
        view = _from_dlpack(a, name, site)
    else:
        try:
            mem = memoryview(a)
        except TypeError:
            raise TilenestError(f"argument '{name}' must be an array, got {describe(a)}",
                                site, f"pass {ARRAY_KINDS}") from None
        try:
            view = np.asarray(mem)
        except Exception as e:  # noqa: BLE001 - a buffer format numpy cannot read
            raise TilenestError(f"argument '{name}': the buffer of its {describe(a)} cannot "
                                f"be viewed as an array ({type(e).__name__}: {e})", site,
                                "pass a numpy array of the dtype the kernel takes") from None
    if is_immutable(a) and view.flags.writeable:
        view.flags.writeable = False
    return view


def cuda_view(a: Any, name: str, written: bool, site: Site | None = None) -> Any:
    """``a`` for the ``cuda`` target on a GPU: a device array as a cupy array
    sharing its memory (on the current device), any other array as
    :func:`host_view` makes it (the runtime copies host arrays to the device
    and the written ones back)."""
    if isinstance(a, np.ndarray):
        return a
    dev = dlpack_device(a, name)
    on_device = (dev is not None and dev[0] in CUDA_DEVICES) or (
        dev is None and hasattr(a, "__cuda_array_interface__"))
    if not on_device:
        return host_view(a, name, written, site)
    if written and is_immutable(a):
        raise _immutable_output(a, name, site)
    import cupy as cp

    here = cp.cuda.Device().id
    if dev is not None and dev[1] != here:
        raise TilenestError(
            f"argument '{name}' is on {device_name(dev)}, but the kernel runs on cuda:{here} "
            "(the current device)", site,
            f"run the call under `with cupy.cuda.Device({dev[1]}):`, or move the array to "
            f"cuda:{here}")
    if isinstance(a, cp.ndarray):
        return a
    try:
        return cp.from_dlpack(a) if dev is not None else cp.asarray(a)
    except Exception as e:  # noqa: BLE001 - whatever a producer's export raises
        raise TilenestError(f"argument '{name}': its {describe(a)} cannot be used in place "
                            f"({e})", site, _export_hint(a)) from None


def host_arguments(p: Any, args: Sequence[Any], written: Collection[str] | None = None
                   ) -> tuple:
    """The arguments of a call of program ``p`` for a host entry point: every
    tensor argument through :func:`host_view`, every runtime scalar given as a
    DLPack array too (read as its value later); others unchanged. ``written``:
    the tensors the caller's arrays receive stores to (default: every tensor
    ``p`` stores to; an oracle that writes only copies passes ``()``)."""
    return _convert(p, args, written, host_view)


def cuda_arguments(p: Any, args: Sequence[Any], written: Collection[str] | None = None
                   ) -> tuple:
    """As :func:`host_arguments`, for the ``cuda`` target on a GPU: tensor
    arguments through :func:`cuda_view`."""
    return _convert(p, args, written, cuda_view)


def _convert(p: Any, args: Sequence[Any], written: Collection[str] | None, view: Any) -> tuple:
    """Each argument as ``view`` sees it; an error is reported at the user's
    line that made the call (else the kernel's location)."""
    from .types import TensorType

    if len(args) != len(p.args):
        return tuple(args)  # the arity error is bind_call's, with its message
    out = []
    try:
        for v, a in zip(p.args, args, strict=True):
            if isinstance(a, np.ndarray):
                out.append(a)
            elif isinstance(v.type, TensorType):
                if written is None:  # walked only for a call with other arrays
                    written = {op.operands[0].name for op in p.walk()
                               if op.name == "tensor.store"}
                x = view(a, v.name, v.name in written, None)
                _check_dtype(a, x, v.name, v.type.dtype)
                out.append(x)
            elif dlpack_device(a, v.name) is not None:
                out.append(host_view(a, v.name, False, None))
            else:
                out.append(a)
    except TilenestError as e:
        raise e.with_site(user_site() or p.loc) from None
    return tuple(out)


def _check_dtype(original: Any, view: Any, name: str, want: Any) -> None:
    """An array of another framework whose dtype is not the kernel's: refused
    here, with the conversion spelled in that framework (numpy arrays get
    ``bind_call``'s numpy spelling)."""
    if view.dtype == want.np:
        return
    from ..errors import TypeCheckError

    root = type(original).__module__.split(".")[0]
    npname = np.dtype(want.np).name
    if root == "torch":
        how = f"{name}.to(torch.{npname})"
    elif is_immutable(original):
        how = f"{name}.astype(jnp.{npname})"
    elif root == "cupy":
        how = f"{name}.astype(cupy.{npname})"
    else:
        how = f"np.asarray({name}, dtype=np.{npname})"
    raise TypeCheckError(f"argument '{name}' is a {describe(original)} of dtype "
                         f"{_dtype_name(original, view)}, the kernel needs {want}", None,
                         f"convert it: {how}")


def _dtype_name(original: Any, view: Any) -> str:
    dt = getattr(original, "dtype", None)
    return str(dt) if dt is not None else str(view.dtype)


def stand_in(a: Any) -> np.ndarray:
    """A numpy array with ``a``'s dtype and shape over one element of fresh
    memory (zero strides), writeable: what the signature checks of a call see
    of a device array, whose elements the host cannot read."""
    return np.ndarray(tuple(a.shape), np.dtype(a.dtype), buffer=bytearray(max(1, a.itemsize)),
                      strides=(0,) * len(a.shape))


def is_packed(a: Any) -> bool:
    """Whether a compiled kernel can read ``a`` in place: C-contiguous, and its
    first element aligned to its element size (numpy or cupy)."""
    if isinstance(a, np.ndarray):
        return bool(a.flags.c_contiguous and a.flags.aligned)
    return bool(a.flags.c_contiguous) and int(a.data.ptr) % max(1, a.itemsize) == 0


def row_strides(a: Any) -> tuple[int, ...] | None:
    """The strides of ``a`` in elements when a compiled kernel can read it
    through a strided view (``Schedule.strided``): a host array whose
    innermost dimension is packed (stride one element, or extent at most 1)
    and whose other strides are non-negative whole elements, aligned; else
    None (a C-contiguous array has its dense strides)."""
    if not isinstance(a, np.ndarray) or not a.flags.aligned or a.ndim == 0:
        return None
    size = a.itemsize
    st = a.strides
    if any(x < 0 or x % size for x in st) or (a.shape[-1] > 1 and st[-1] != size):
        return None
    return tuple(x // size for x in st[:-1]) + (1,)


def span(a: np.ndarray) -> np.ndarray:
    """The memory a strided view ``a`` (:func:`row_strides`) reaches, as a
    packed 1-D array of its dtype from its first element to its last (the
    elements between belong to the array it views): what a kernel indexing
    ``a`` by its strides is given."""
    n = 1 + sum((x - 1) * s for x, s in zip(a.shape, row_strides(a) or (), strict=True)) \
        if a.size else 0
    return strided(a, (n,), (a.itemsize,), bool(a.flags.writeable))


def is_float_storage(dt: np.dtype) -> bool:
    """Whether the numpy dtype ``dt`` holds a float format: numpy's own or one
    of ``ml_dtypes``' (bfloat16, the FP8 formats), whose numpy kind is 'V'."""
    from .dtypes import ML_DTYPES

    return bool(np.issubdtype(dt, np.floating)) or dt.name in ML_DTYPES.values()


def poison_value(dt: np.dtype) -> Any:
    """What fills memory no one has written: NaN for floats; for integers the
    most negative value (or the largest, unsigned); True for bool."""
    if is_float_storage(dt):
        return np.array(np.nan, dtype=np.float32).astype(dt)
    if dt == np.bool_:
        return True
    info = np.iinfo(dt)
    return info.min if info.min < 0 else info.max


def bits_dtype(dt: np.dtype) -> np.dtype:
    """The unsigned integers of ``dt``'s width when ``dt`` is one of
    ``ml_dtypes``' formats (bfloat16, the FP8 formats), which device array
    libraries may not know (CuPy has no FP8 dtype); else ``dt`` itself."""
    from .dtypes import ML_DTYPES

    dt = np.dtype(dt)
    return np.dtype(f"u{dt.itemsize}") if dt.name in ML_DTYPES.values() else dt


def as_bits(a: np.ndarray) -> np.ndarray:
    """``a`` viewed as :func:`bits_dtype` of its dtype: what a copy to or from
    a device moves, bit for bit (other arrays are returned as they are)."""
    dt = bits_dtype(a.dtype)
    return a if dt == a.dtype else a.view(dt)


def strided(a: np.ndarray, shape: tuple[int, ...], strides: Any, writeable: bool) -> np.ndarray:
    """``np.lib.stride_tricks.as_strided`` for every storage dtype: it goes
    through numpy's array interface, which cannot name some (the FP8
    formats), so the view is made of the raw bits and then retyped."""
    raw = np.asarray(a).view(np.dtype(f"u{a.itemsize}"))
    return np.lib.stride_tricks.as_strided(raw, shape, strides, writeable=writeable).view(a.dtype)


def input_alias(a: np.ndarray) -> np.ndarray:
    """``a`` itself when numpy lets it be written; else a writeable view of the
    same memory (no copy), for handing a tensor the kernel only *reads* to a
    launcher that types every pointer as mutable (the CUDA emulator refuses a
    read-only array for a non-``const`` pointer). Only for packed arrays of
    parameters the kernel never stores to: nothing may write through the alias
    (it may be a jax array's buffer, or a broadcast's single row)."""
    if a.flags.writeable:
        return a
    if not a.flags.c_contiguous:
        raise ValueError("input_alias needs a C-contiguous array")
    import ctypes

    if a.nbytes == 0:
        return np.zeros(a.shape, a.dtype)
    buf = (ctypes.c_char * a.nbytes).from_address(address(a))
    return np.frombuffer(memoryview(buf), dtype=a.dtype).reshape(a.shape)


def address(a: Any) -> int:
    """The address of ``a``'s first element (host, or device for a cupy array)."""
    return int(a.ctypes.data) if isinstance(a, np.ndarray) else int(a.data.ptr)


def shares_memory(a: Any, b: Any) -> bool:
    """Whether two arrays of a call may touch one byte: exactly for numpy arrays
    (``np.shares_memory``); for device arrays (C-contiguous, checked first) by
    their byte ranges; a host array and a device array never do."""
    host_a, host_b = isinstance(a, np.ndarray), isinstance(b, np.ndarray)
    if host_a and host_b:
        return bool(np.shares_memory(a, b))
    if host_a or host_b:
        return False
    lo_a, lo_b = address(a), address(b)
    return lo_a < lo_b + b.nbytes and lo_b < lo_a + a.nbytes


def packed_hint(original: Any, view: Any) -> str:
    """How to make the array ``original`` (seen as ``view``) readable in place."""
    if isinstance(original, np.ndarray):
        return "pass np.ascontiguousarray(x) (and copy results back if needed)"
    if type(original).__module__.split(".")[0] == "torch":
        return "pass x.contiguous() (and copy results back if needed)"
    if not isinstance(view, np.ndarray):
        return "pass cupy.ascontiguousarray(x) (and copy results back if needed)"
    return "pass a C-contiguous copy (and copy results back if needed)"


def _from_dlpack(a: Any, name: str, site: Site | None) -> np.ndarray:
    """``np.from_dlpack(a)``, with the errors of a refused export as tilenest
    errors; a torch bfloat16 tensor is viewed through its bits (numpy's DLPack
    import has no bfloat16)."""
    if _is_torch_neg(a):
        # numpy's DLPack import drops torch's lazy negation: the view would hold
        # the values un-negated
        raise TilenestError(f"argument '{name}' is a negated view of a torch tensor (its neg "
                            "bit is set), which cannot be viewed without a copy", site,
                            "pass x.resolve_neg() (a tensor holding the negated values)")
    try:
        if _is_torch_bf16(a):
            import ml_dtypes
            import torch

            return np.from_dlpack(a.view(torch.int16)).view(ml_dtypes.bfloat16)
        return np.from_dlpack(a)
    except Exception as e:  # noqa: BLE001 - whatever a producer's export raises
        raise TilenestError(f"argument '{name}': its {describe(a)} cannot be viewed as a host "
                            f"array ({e})", site, _export_hint(a)) from None


def _is_torch_neg(a: Any) -> bool:
    torch = sys.modules.get("torch")
    return (torch is not None and isinstance(a, torch.Tensor) and hasattr(a, "is_neg")
            and bool(a.is_neg()))


def _is_torch_bf16(a: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16


def _export_hint(a: Any) -> str:
    root = type(a).__module__.split(".")[0]
    if root == "torch":
        return ("a tensor that requires grad needs x.detach(); a conjugated or negated view "
                "needs x.resolve_conj() / x.resolve_neg(); other dtypes need x.to(dtype)")
    return ("pass an array of a dtype numpy knows (bool, integers, float16/32/64), or a numpy "
            "array")


def _immutable_output(a: Any, name: str, site: Site | None) -> TilenestError:
    return TilenestError(
        f"argument '{name}' is written by the kernel, but it is a {describe(a)} and jax "
        "arrays are immutable", site,
        "pass a writeable array for the output (e.g. np.zeros(shape, dtype)) and make a jax "
        "array of it afterwards (jnp.asarray(out)); jax arrays are fine as inputs")
