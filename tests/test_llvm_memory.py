"""Memory rules a compiled kernel must keep: aliased parameters (M-8) and the
checked build of ``bounds.assume`` promises (M-7)."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32


@tn.kernel
def snap(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    (n,) = x.shape
    before = x[tn.coord(0), tn.shape(n)]
    y(tn.coord(0), tn.shape(n)).store(before + 1.0)
    z(tn.coord(0), tn.shape(n)).store(before * 3.0)


@tn.kernel
def double(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        i = tn.coord(p.index())
        y(i, tn.shape(1)).store(x[i, tn.shape(1)] * 2.0)


@tn.kernel
def head(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    y(tn.coord(0), tn.shape(4), tn.bounds.assume).store(
        x[tn.coord(0), tn.shape(4), tn.bounds.assume])


def test_one_array_for_two_parameters_reads_a_snapshot():
    """x and y are one array: the load of x is a snapshot taken before the store
    through y, so z gets three times the old values (M-3 with M-8)."""
    ck = snap.compile(target="llvm")
    a = np.arange(7, dtype=np.float32)
    z = np.zeros(7, np.float32)
    ck(a, a, z)
    b = np.arange(7, dtype=np.float32)
    zi = np.zeros(7, np.float32)
    tn.interpret(snap.program, b, b, zi)
    assert a.tolist() == b.tolist() == [v + 1.0 for v in range(7)]
    assert z.tolist() == zi.tolist() == [3.0 * v for v in range(7)]


def test_aliased_call_runs_a_variant_without_noalias():
    ck = double.compile(target="llvm")
    a = np.arange(1000, dtype=np.float32)
    ck(a, a)
    assert np.array_equal(a, 2 * np.arange(1000, dtype=np.float32))
    var = ck.variant(ck.aliases([a, a]))
    assert var is not ck and var.schedule.aliases == (("x", "y"),)
    # the two parameter buffers (the first two arguments of the phase body) lose
    # ``noalias``; without aliasing they have it
    def params(ir: str) -> list[str]:
        line = next(ln for ln in ir.splitlines() if ln.startswith("define") and ".body" in ln)
        return line.split("(", 1)[1].split(", ")[:2]

    assert all("noalias" in p for p in params(ck.llvm_ir))
    assert not any("noalias" in p for p in params(var.llvm_ir))
    # separate arrays use the kernel compiled without aliases
    y = np.zeros(1000, np.float32)
    assert ck.aliases([a, y]) == ()


def test_partial_overlap_is_refused_with_a_hint():
    ck = double.compile(target="llvm")
    a = np.arange(10, dtype=np.float32)
    with pytest.raises(tn.errors.TilenestError, match="without being the same array") as e:
        ck(a[1:], a[:-1])
    assert "interpreter" in (e.value.hint or "")


def test_read_only_sharing_is_no_alias():
    @tn.kernel
    def add(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        z = z.with_dims(x.dim(0))
        z(tn.coord(0), tn.shape(n)).store(x[tn.coord(0), tn.shape(n)] + y[tn.coord(0), tn.shape(n)])

    ck = add.compile(target="llvm")
    a = np.arange(5, dtype=np.float32)
    z = np.zeros(5, np.float32)
    assert ck.aliases([a, a, z]) == ()
    ck(a, a, z)
    assert z.tolist() == [2.0 * v for v in range(5)]


def test_assume_promises_are_skipped_by_default_and_checked_in_a_checked_build():
    x, y = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    head.compile(target="llvm")(x, y)
    assert y.tolist() == [0, 1, 2, 3]
    checked = head.compile(target="llvm", check_assumes=True)
    checked(x, y)  # a kept promise costs nothing but the check
    with pytest.raises(tn.errors.BoundsError, match="bounds.assume promise") as e:
        checked(np.arange(3, dtype=np.float32), y)
    assert "test_llvm_memory.py" in e.value.render()  # the site of the store in the kernel
    with pytest.raises(tn.errors.BoundsError):
        tn.interpret(head.program, np.arange(3, dtype=np.float32), y)


@tn.kernel
def shift(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n - 1)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index() + 1), tn.shape(1)])


def test_aliasing_race_across_instances_is_refused_before_running():
    """Instance p reads x[p+1], which instance p+1 writes through y: with one
    array for both, the gate refutes noninterference for the alias group; with
    separate arrays the kernel is legal and runs."""
    ck = shift.compile(target="llvm")
    a = np.arange(6, dtype=np.float32)
    b = np.zeros(6, np.float32)
    ck(a, b)
    assert b[:5].tolist() == [1, 2, 3, 4, 5]
    with pytest.raises(tn.errors.RaceError) as e:
        ck(a, a)
    text = e.value.render()
    assert "test_llvm_memory.py" in text and "%x" in text
    assert a.tolist() == list(range(6))  # refused before anything ran
    with pytest.raises(tn.errors.RaceError):
        tn.interpret(shift.program, a, a)
