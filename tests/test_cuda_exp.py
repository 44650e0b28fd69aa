"""The CUDA prelude's narrow ``exp`` is the LLVM backend's formula step for
step (spec/lowering.md L-6): the two targets agree bit for bit, on the
emulated device, over every region of the formula -- the common case (and
either side of its bound), the subnormal results, overflow, underflow to
zero, the clamps, NaN and the infinities."""

from __future__ import annotations

import numpy as np

import tilenest as tn
from tilenest.backends import cuda


@tn.kernel
def exps(x: tn.Tensor[tn.f32, "N"], y: tn.Tensor[tn.f32, "N"]):
    (n,) = x.shape
    (d,) = x.dims()
    y = y.with_dims(d)
    for p in tn.parallel(tn.shape(1)):
        y(tn.coord(0), tn.shape(n)).store(tn.exp(x[tn.coord(0), tn.shape(n)]))


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    ln2 = np.float32(np.log(2.0))
    edges = []
    for k in (-151, -150, -149, -127, -126, -125, -1, 0, 1, 126, 127, 128, 129):
        c = np.float32(k) * ln2  # where round(x / ln2) changes, and beside it
        edges += [np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))]
        edges += list(c + np.float32(0.5) * ln2 + np.float32(2.0**-18) * np.arange(-4, 5))
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -104.0, 89.0, -103.97, 88.72, 88.73,
               -87.33, -87.34, 1e-30, -1e-30, 1e-45, 3.4e38, -3.4e38,
               # either side of the common case's bound |x| <= 87
               87.0, -87.0, 87.00001, -87.00001, 86.99999, -86.99999]
    return np.concatenate([
        np.array(edges + special, np.float32),
        rng.uniform(-110, 95, 60000).astype(np.float32),
        rng.uniform(-30, 3, 30000).astype(np.float32),  # softmax's x - max
        (rng.standard_normal(10000) * 1e-3).astype(np.float32)])


def test_cuda_exp_agrees_bitwise_with_llvm():
    x = _inputs()
    gpu = np.full_like(x, np.nan)
    cpu = np.full_like(x, np.nan)
    cuda.compile_program(exps.program, device="emulated")(x, gpu)
    exps.compile(target="llvm")(x, cpu)
    nan = np.isnan(cpu)
    assert np.array_equal(np.isnan(gpu), nan)
    same = gpu.view(np.uint32)[~nan] == cpu.view(np.uint32)[~nan]
    assert same.all(), list(zip(x[~nan][~same][:5], gpu[~nan][~same][:5], cpu[~nan][~same][:5]))
    # the regions were reached: subnormal results, overflow, underflow to zero
    fin = gpu[~nan]
    assert (fin == np.inf).any() and (fin == 0).any()
    assert ((fin > 0) & (fin < np.finfo(np.float32).tiny)).any()


@tn.kernel
def row_exp_sums(x: tn.Tensor[tn.f32, "R C"], s: tn.Tensor[tn.f32, "R"]):
    rows, cols = x.shape
    r, c = x.dims()
    s = s.with_dims(r)
    for p in tn.parallel(tn.shape(rows)):
        s(tn.coord(p.index()), tn.shape(1)).store(
            tn.reduce(tn.exp(x[tn.coord(p.index(), 0), tn.shape(1, cols)]), c, tn.add))


def test_guarded_lane_groups_restore_the_accumulator():
    """A wide group of lanes whose ``exp`` inputs leave the common case is
    computed again with the whole function (``Emitter.guarded_lanes``),
    starting from the partial sum it had before the group: the rows' sums are
    those of the exact terms (no lane counted twice, none with a common-case
    value outside the common case)."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-3, 1, (6, 1000)).astype(np.float32)
    x[0, [100, 517]] = [88.0, 87.2]  # above the common case, the sum finite
    x[1, 5::41] = -95.0     # below it: subnormal terms
    x[2, 3::8] = -120.0     # below it: terms 0
    x[3, :] = np.float32(-87.5)  # every group outside, all lanes alike
    s = np.full(6, np.nan, np.float32)
    ck = cuda.compile_program(row_exp_sums.program, device="emulated")
    assert "tn_exp_f32_ok(" in ck.source.text  # the group's first pass: common cases
    ck(x, s)
    terms = np.full_like(x, np.nan)
    exps.compile(target="llvm")(x.ravel(), terms.ravel())
    want = terms.astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(s, want, rtol=1e-5)
