"""The Metal argument contract (tilenest/backends/metal/arguments.py): buffer
order and qualifiers, the constant struct's offsets (computed here, packed
with numpy and checked against clang's own layout of the emitted struct),
launch geometry limits, and the runtime's refusal off macOS."""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.backends.metal import arguments as MA
from tilenest.backends.metal import check
from tilenest.errors import NotAvailableError, TargetCheckError, TilenestError
from tilenest.lowering import loopir as L
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E

needs_clang = pytest.mark.skipif(not check.clang_available(),
                                 reason="clang-19 is not installed (make test installs it)")


def _mixed() -> L.Kernel:
    """A kernel of mixed scalar arguments between tensors, a scratch buffer
    and two symbols (one a stride symbol, whose name is no C identifier)."""
    g = (L.Buffer("x", D.f16, "global", E.Sym("N"), 0),
         L.Buffer("flag", D.bool_, "scalar", E.Const(1), 1),
         L.Buffer("big", D.i64, "scalar", E.Const(1), 2),
         L.Buffer("y", D.bool_, "global", E.Sym("N"), 3),
         L.Buffer("h", D.f16, "scalar", E.Const(1), 4),
         L.Buffer("b", D.bf16, "scalar", E.Const(1), 5),
         L.Buffer("c", D.i8, "scalar", E.Const(1), 6),
         L.Buffer("alpha", D.f32, "scalar", E.Const(1), 7),
         L.Buffer("u", D.u16, "scalar", E.Const(1), 8),
         L.Buffer("tmp", D.f32, "global", E.Sym("N"), 9))
    return L.Kernel("mixed", (), ("N", "x.stride0"), (), (), (), g)


def test_buffers_then_struct_then_status():
    """Tensors take buffers 0..n-1 in argument order (scratch last, always
    written; read-only as const device; bool as uchar); scalars leave the
    buffer list for the struct, at buffer n; the status word is n+1."""
    lay = MA.layout(_mixed(), written={"y"}, arguments=9)
    assert [(t.buffer, t.index, t.elem, t.written) for t in lay.tensors] == [
        ("x", 0, "half", False), ("y", 1, "uchar", True), ("tmp", 2, "float", True)]
    decl, params = lay.msl_struct()
    assert params.split(", ")[0] == "const device half* b_x [[buffer(0)]]"
    assert "device uchar* b_y [[buffer(1)]]" in params
    assert f"constant {lay.struct_name}& tn_args [[buffer(3)]]" in params
    assert params.endswith("device atomic_int* tn_status [[buffer(4)]]")


def test_struct_offsets_follow_msl_alignment():
    """Members in argument order, then symbols as 64-bit longs, each at the
    next multiple of its alignment; the size rounds up to the largest."""
    lay = MA.layout(_mixed(), written=(), arguments=9)
    got = [(m.source, m.type, m.offset) for m in lay.members]
    assert got == [("flag", "bool", 0), ("big", "long", 8), ("h", "half", 16),
                   ("b", "bfloat", 18), ("c", "char", 20), ("alpha", "float", 24),
                   ("u", "ushort", 28), ("N", "long", 32), ("x.stride0", "long", 40)]
    assert (lay.size, lay.align) == (48, 8)
    assert lay.member("symbol", "x.stride0").name == "s_x_stride0"


def test_pack_puts_each_value_at_its_offset():
    lay = MA.layout(_mixed(), written=(), arguments=9)
    raw = lay.pack({"flag": True, "big": -2**40, "h": 1.5, "b": -2.0, "c": -7,
                    "alpha": 0.1, "u": 65535}, {"N": 1000, "x.stride0": 3})
    assert len(raw) == 48
    assert raw[0] == 1 and raw[1:8] == bytes(7)  # padding is zero
    assert struct.unpack_from("<q", raw, 8)[0] == -2**40
    assert struct.unpack_from("<e", raw, 16)[0] == 1.5
    assert struct.unpack_from("<H", raw, 18)[0] == 0xC000  # bfloat -2.0: its top 16 bits
    assert struct.unpack_from("<b", raw, 20)[0] == -7
    assert struct.unpack_from("<f", raw, 24)[0] == np.float32(0.1)
    assert struct.unpack_from("<H", raw, 28)[0] == 65535
    assert struct.unpack_from("<qq", raw, 32) == (1000, 3)


def test_pack_refuses_missing_and_unrepresentable_values():
    lay = MA.layout(_mixed(), written=(), arguments=9)
    vals = {"flag": 0, "big": 1, "h": 0.0, "b": 0.0, "c": 0, "alpha": 0.0, "u": 0}
    with pytest.raises(TilenestError, match="symbol 'x.stride0'"):
        lay.pack(vals, {"N": 1})
    with pytest.raises(TilenestError, match="argument 'c'"):
        lay.pack({**vals, "c": 300}, {"N": 1, "x.stride0": 1})


def _offset_asserts(lay: MA.ArgumentLayout) -> str:
    """MSL declaring the struct and a kernel taking the layout's parameters,
    with clang asserting every offset and the size this module computed."""
    decl, params = lay.msl_struct()
    checks = "".join(f'static_assert(__builtin_offsetof({lay.struct_name}, {m.name}) == '
                     f'{m.offset}, "{m.name}");\n' for m in lay.members)
    return ("#include <metal_stdlib>\nusing namespace metal;\n" + decl + checks
            + f'static_assert(sizeof({lay.struct_name}) == {lay.size}, "size");\n'
            + f'static_assert(alignof({lay.struct_name}) == {lay.align}, "align");\n'
            + f"kernel void k({params}) {{\n"
            + "  if (tn_args.s_N < 0) {\n"
            + "    int expected = 0;\n"
            + "    atomic_compare_exchange_weak_explicit(tn_status, &expected, 1, "
              "memory_order_relaxed, memory_order_relaxed);\n  }\n}\n")


@needs_clang
def test_clang_lays_the_struct_out_where_pack_puts_the_bytes():
    """The emitted struct and parameter list type-check against the shim,
    and clang's offsets, size and alignment are the ones pack() uses."""
    lay = MA.layout(_mixed(), written={"y"}, arguments=9)
    check.check_msl(_offset_asserts(lay), "args.metal")


@needs_clang
def test_a_wrong_offset_is_caught_by_the_clang_check():
    """The offset check has teeth: one member moved is a compile error."""
    lay = MA.layout(_mixed(), written=(), arguments=9)
    moved = tuple(MA.Member(m.name, m.type, m.offset + (m.name == "a_alpha"), m.kind, m.source)
                  for m in lay.members)
    bad = MA.ArgumentLayout(lay.struct_name, lay.tensors, moved, lay.size, lay.align)
    with pytest.raises(TargetCheckError, match="static assertion failed"):
        check.check_msl(_offset_asserts(bad), "args.metal")


@needs_clang
def test_a_write_through_a_read_only_tensor_is_refused_by_clang():
    lay = MA.layout(_mixed(), written={"y"}, arguments=9)
    decl, params = lay.msl_struct()
    src = ("#include <metal_stdlib>\nusing namespace metal;\n" + decl
           + f"kernel void k({params}) {{ b_x[0] = b_x[1]; }}\n")
    with pytest.raises(TargetCheckError, match="read-only variable is not assignable"):
        check.check_msl(src, "ro.metal")


@tn.kernel
def _scale(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], a: tn.Scalar[f32]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, 64))):
        i = p.index() * 64
        y(tn.coord(i), tn.shape(64)).store(x[tn.coord(i), tn.shape(64)] * a)


def test_layout_of_a_lowered_kernel():
    """A lowered program: its tensors in argument order (the read-only one
    const), its scalar and its symbol in the struct."""
    from tilenest.lowering import default_schedule, lower_verified
    from tilenest.semantics.signature import stored_tensors

    p = _scale.program
    k = lower_verified(p, default_schedule(p, "cuda"))
    lay = MA.layout(k, stored_tensors(p))
    assert [(t.buffer, t.written) for t in lay.tensors[:2]] == [("x", False), ("y", True)]
    assert all(t.written for t in lay.tensors[2:])  # scratch, if any
    assert [m.source for m in lay.members] == ["a", *k.syms]
    raw = lay.pack({"a": 2.0}, {s: 128 for s in k.syms})
    assert struct.unpack_from("<f", raw, lay.member("scalar", "a").offset)[0] == 2.0


def test_f64_is_refused_with_a_hint():
    k = L.Kernel("d", (), (), (), (), (), (L.Buffer("z", D.f64, "global", E.Const(4), 0),))
    with pytest.raises(NotAvailableError, match="tensor 'z' has dtype f64") as e:
        MA.layout(k, (), arguments=1)
    assert e.value.hint and "f32" in e.value.hint


def test_a_kernel_without_scalars_or_symbols_gets_a_nonempty_struct():
    k = L.Kernel("e", (), (), (), (), (), (L.Buffer("z", D.f32, "global", E.Const(4), 0),))
    lay = MA.layout(k, {"z"}, arguments=1)
    assert [m.kind for m in lay.members] == ["pad"] and lay.size == 4
    assert lay.pack({}, {}) == bytes(4)


def test_launch_geometry():
    assert MA.launch_geometry("p0", 37, 256, 4096) == ((37, 1, 1), (256, 1, 1))
    assert MA.launch_geometry("p0", 1, 1024, 32 * 1024) == ((1, 1, 1), (1024, 1, 1))


@pytest.mark.parametrize("programs,threads,smem,words", [
    (4, 2048, 0, ["2048 threads", "1 to 1024"]),
    (4, 0, 0, ["0 threads"]),
    (4, 256, 32 * 1024 + 1, ["32769 bytes", "32768"]),
    (2**32, 32, 0, ["4294967296 programs"]),
])
def test_launch_geometry_refusals(programs, threads, smem, words):
    with pytest.raises(TilenestError) as e:
        MA.launch_geometry("k_p1", programs, threads, smem)
    for w in ["k_p1", *words]:
        assert w in e.value.message
    assert e.value.hint


@pytest.mark.skipif(sys.platform == "darwin", reason="off macOS only")
def test_the_runtime_refuses_off_macos_with_a_hint():
    from tilenest.backends.metal import runtime

    with pytest.raises(NotAvailableError, match="needs macOS") as e:
        runtime.MetalDevice("kernel void k() {}")
    assert e.value.hint and "emulated" in e.value.hint and "tilenest[metal]" in e.value.hint


def test_the_runtime_names_the_missing_pyobjc_package(monkeypatch):
    from tilenest.backends.metal import runtime

    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    monkeypatch.setitem(sys.modules, "Metal", None)  # an import of it fails
    with pytest.raises(NotAvailableError, match="pyobjc-framework-Metal") as e:
        runtime.metal_module()
    assert e.value.hint and "tilenest[metal]" in e.value.hint
