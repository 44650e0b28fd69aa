"""The FP8 formats f8e4m3fn and f8e5m2 (spec/values.md, *FP8*): exact
conversions against ml_dtypes on every code, casts into FP8 with each overflow
policy, the ops that take FP8 operands and the errors for the rest, the
interchange of the cast's policy, and the targets' refusal."""

from __future__ import annotations

import functools

import json

import ml_dtypes
import numpy as np
import pytest

import tilenest as tn
from tilenest import f8e4m3fn, f8e5m2, f32
from tilenest.errors import NotAvailableError, TypeCheckError
from tilenest.semantics import dtypes as D
from tilenest.semantics import jsonio
from tilenest.semantics import numerics as N

FP8 = (D.f8e4m3fn, D.f8e5m2)
WIDER = (D.f16, D.bf16, D.f32, D.f64)


def codes(dt):
    """Every value of the FP8 format ``dt``, by its 256 encodings."""
    return np.arange(256, dtype=np.uint8).view(dt.np)


def same_bits(a, b):
    """Equal encodings, except that any two NaNs of one sign match (a NaN's
    payload is not part of its value)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype
    nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
    sign = np.signbit(a.astype(np.float64)) == np.signbit(b.astype(np.float64))
    bits = a.view(f"u{a.dtype.itemsize}") == b.view(f"u{b.dtype.itemsize}")
    return bool(np.all(np.where(nan, sign, bits)))


def saturated(x64, r, dt):
    """``r`` (ml_dtypes' conversion, which overflows to the non-finite value)
    with overflow replaced by the largest finite value of the source's sign."""
    top = N.FP8_MAX[dt.name]
    over = ~np.isfinite(r.astype(np.float64)) & ~np.isnan(x64)
    with np.errstate(invalid="ignore"):
        return np.where(over, np.where(np.signbit(x64), -top, top),
                        r.astype(np.float64)).astype(dt.np)


@pytest.mark.parametrize("src", FP8, ids=str)
@pytest.mark.parametrize("dst", WIDER, ids=str)
def test_every_fp8_code_widens_exactly(src, dst):
    x = codes(src)
    got = N.cast(x, src, dst)
    assert same_bits(got, x.astype(dst.np))
    # exact: back to the format with either policy, every code returns
    back = N.cast(got, dst, src, "nonfinite")
    assert same_bits(back, x)


@pytest.mark.parametrize("src", FP8, ids=str)
def test_fp8_to_integers_and_bool(src):
    x = codes(src)
    f = x.astype(np.float64)
    got = N.cast(x, src, D.i32)
    want = np.where(np.isnan(f), 0, np.trunc(np.nan_to_num(f, posinf=2**31 - 1,
                                                           neginf=-2**31)))
    assert np.array_equal(got, want.astype(np.int32))
    assert np.array_equal(N.cast(x, src, D.bool_), f != 0)


_SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 464.0, 61440.0, 2.0**-10, 2.0**-17,
                      3e38], np.float32)
# NaNs of every kind of payload: signalling, quiet, all ones
_NANS = np.array([0x7fa00000, 0x7fe00000, 0x7fffffff, 0x7f800001], np.uint32).view(np.float32)
#: the end of the probe: the specials and the NaNs, each with both signs
_PROBE_TAIL = np.concatenate([_SPECIALS, -_SPECIALS, _NANS, -_NANS])


def _f32_probe():
    """f32 values dense around every rounding boundary of both formats: all
    f32 with 10 significant bits (each FP8 value, each midpoint between
    neighbours, and the values between), the f32 neighbours of each FP8
    midpoint, the specials and NaNs of several payloads."""
    top = np.arange(1 << 19, dtype=np.uint32) << np.uint32(13)  # 10 significand bits
    x = top.view(np.float32)
    mids = []
    for dt in FP8:
        v = np.unique(codes(dt).astype(np.float64))
        v = v[np.isfinite(v)]
        m = ((v[1:] + v[:-1]) / 2).astype(np.float32)
        mids += [m, np.nextafter(m, np.float32(np.inf)), np.nextafter(m, np.float32(-np.inf))]
    return np.concatenate([x, *mids, _PROBE_TAIL])


@pytest.mark.parametrize("dst", FP8, ids=str)
def test_f32_rounds_once_to_nearest_even_with_each_policy(dst):
    x = _f32_probe()
    nonfinite = x.astype(dst.np)  # ml_dtypes: nearest even, overflow to NaN / inf
    assert same_bits(N.cast(x, D.f32, dst, "nonfinite"), nonfinite)
    assert same_bits(N.cast(x, D.f32, dst, "saturate"),
                     saturated(x.astype(np.float64), nonfinite, dst))


def test_overflow_points():
    e4 = np.array([448.0, 463.9, 464.0, 464.1, 1e9, np.inf, -464.1, -np.inf, np.nan],
                  np.float32)
    assert N.cast(e4, D.f32, D.f8e4m3fn, "saturate").astype(np.float32)[:8].tolist() == [
        448, 448, 448, 448, 448, 448, -448, -448]
    nf = N.cast(e4, D.f32, D.f8e4m3fn, "nonfinite").astype(np.float32)
    assert nf[:3].tolist() == [448, 448, 448] and np.isnan(nf[3:]).all()
    assert np.signbit(nf[6]) and np.signbit(nf[7])  # the NaN keeps the sign
    e5 = np.array([57344.0, 61439.0, 61440.0, np.inf, -1e9], np.float32)
    assert N.cast(e5, D.f32, D.f8e5m2, "nonfinite").astype(np.float32).tolist() == [
        57344, 57344, np.inf, np.inf, -np.inf]
    assert N.cast(e5, D.f32, D.f8e5m2, "saturate").astype(np.float32).tolist() == [
        57344, 57344, 57344, 57344, -57344]


@pytest.mark.parametrize("dst", FP8, ids=str)
def test_f64_and_integers_round_once(dst):
    """From f64 the value is rounded once (an f32 step would round twice):
    every FP8 midpoint nudged by 2^-40 of itself rounds away from the
    midpoint; integers round once too."""
    v = np.unique(codes(dst).astype(np.float64))
    v = v[np.isfinite(v)]
    m = (v[1:] + v[:-1]) / 2
    x = np.concatenate([m * (1 + 2.0**-40), m * (1 - 2.0**-40), m])
    want = x.astype(dst.np)  # ml_dtypes converts f64 directly
    assert same_bits(N.cast(x, D.f64, dst, "nonfinite"), want)
    assert not same_bits(x.astype(np.float32).astype(dst.np), want)  # the f32 step misses
    i = np.arange(-70000, 70000, 7, dtype=np.int64)
    assert same_bits(N.cast(i, D.i64, dst, "saturate"),
                     saturated(i.astype(np.float64), i.astype(np.float64).astype(dst.np), dst))


@pytest.mark.parametrize("src,dst", [(D.f8e4m3fn, D.f8e5m2), (D.f8e5m2, D.f8e4m3fn)], ids=str)
def test_between_the_formats(src, dst):
    x = codes(src)
    f = x.astype(np.float64)
    r = f.astype(dst.np)
    assert same_bits(N.cast(x, src, dst, "nonfinite"), r)
    assert same_bits(N.cast(x, src, dst, "saturate"), saturated(f, r, dst))


# ---------------------------------------------------------------------------
# kernels


@tn.kernel
def quantize(x: tn.Tensor[f32, "N"], y: tn.Tensor[f8e4m3fn, "N"],  # noqa: F821
             z: tn.Tensor[f32, "N"], *, bn=16):  # noqa: F821
    """y = x * 2 in e4m3fn (saturating); z = y decoded, plus 1 where y > 0."""
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, bn))):
        t = x[tn.coord(p.index() * bn), tn.shape(bn), tn.bounds.zero]
        q = tn.cast(t * 2.0, f8e4m3fn, overflow="saturate")
        y(tn.coord(p.index() * bn), tn.shape(bn)).store(q)
        pos = q > tn.zeros(f8e4m3fn, tn.shape(bn), dims=t.dims())
        z(tn.coord(p.index() * bn), tn.shape(bn)).store(tn.cast(q, f32) + tn.cast(pos, f32))


@functools.cache
def one_mma(ta, tb, reassoc=True):  # type: ignore[no-untyped-def]
    """The kernel ``c = a b``: one ``mma`` over the whole tile of ``ta`` and
    ``tb`` operands (``b`` stored K x N) into f32, reassociating or strict."""
    @tn.kernel
    def product(a: tn.Tensor[ta, "M K"], b: tn.Tensor[tb, "K N"],  # noqa: F821
                c: tn.Tensor[f32, "M N"]):  # noqa: F821
        M, K = a.shape
        N = b.shape[1]
        m, k = a.dims()
        b = b.with_dims(k, c.dim(1))
        c = c.with_dims(m, c.dim(1))
        for _p in tn.parallel(tn.shape(1)):
            acc = tn.zeros(f32, tn.shape(M, N), dims=(m, c.dim(1)))
            acc = tn.mma(a[tn.coord(0, 0), tn.shape(M, K)], b[tn.coord(0, 0), tn.shape(K, N)],
                         acc, allow_reassociation=reassoc)
            c(tn.coord(0, 0), tn.shape(M, N)).store(acc)

    return product


fp8_mma = one_mma(f8e5m2, f8e4m3fn)


def test_a_quantizing_kernel_on_the_interpreter():
    x = (np.random.default_rng(0).standard_normal(100) * 200).astype(np.float32)
    y = np.zeros(100, ml_dtypes.float8_e4m3fn)
    z = np.zeros(100, np.float32)
    quantize(x, y, z)
    want = np.clip(x * 2, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert same_bits(y, want)
    assert np.array_equal(z, want.astype(np.float32) + (want.astype(np.float32) > 0))


def test_mma_takes_fp8_operands_into_f32():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 12)).astype(ml_dtypes.float8_e5m2)
    b = rng.standard_normal((12, 7)).astype(ml_dtypes.float8_e4m3fn)
    c = np.zeros((5, 7), np.float32)
    fp8_mma(a, b, c)
    # the products are exact in f32 (at most 4 x 3 significand bits); the
    # reassociated f32 sum is within a few roundings of the exact one
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-6)


def test_the_policy_travels_through_text_and_json():
    text = str(quantize.program)
    assert 'overflow = "saturate"' in text
    assert str(tn.parse(text)) == text
    doc = jsonio.dumps(quantize.program)
    assert str(jsonio.from_json(json.loads(doc))) == text


def _program(body):
    """The program of a kernel whose block ``t`` (16 f32) runs ``body``."""
    src = (
        "import tilenest as tn\nfrom tilenest import f32, f8e4m3fn, f8e5m2\n\n"
        "@tn.kernel\n"
        "def k(x: tn.Tensor[f32, 'N'], y: tn.Tensor[f32, 'N']):\n"
        "    for p in tn.parallel(tn.shape(1)):\n"
        "        t = x[tn.coord(0), tn.shape(16), tn.bounds.zero]\n"
        f"        r = {body}\n"
        "        y(tn.coord(0), tn.shape(16)).store(tn.cast(r, f32))\n")
    return src


@pytest.mark.parametrize("body,message", [
    ("tn.cast(t, f8e4m3fn)", "must say what a value beyond the largest finite one becomes"),
    ("tn.cast(t, f8e4m3fn, overflow='clip')", "overflow='clip'"),
    ("tn.cast(tn.cast(t, f32, overflow='saturate'), f8e5m2, overflow='nonfinite')",
     "applies only to casts into an FP8 format"),
    ("tn.cast(t, f8e5m2, overflow='nonfinite') * tn.cast(t, f8e5m2, overflow='nonfinite')",
     "'mul' on f8e5m2 values"),
    ("tn.exp(tn.cast(t, f8e4m3fn, overflow='saturate'))", "'exp' on f8e4m3fn values"),
    ("tn.full(f8e4m3fn, tn.shape(16), 0.3, dims=t.dims())", "not exactly representable"),
    ("tn.reduce(tn.cast(t, f8e4m3fn, overflow='saturate'), t.dim(0), tn.add)", "on f8e4m3fn"),
])
def test_what_fp8_refuses(tmp_path, body, message):
    f = tmp_path / "k.py"
    f.write_text(_program(body))
    with pytest.raises(TypeCheckError) as e:
        ns: dict = {}
        exec(compile(f.read_text(), str(f), "exec"), ns)
        _ = ns["k"].program  # capturing the kernel type-checks it
    assert message in str(e.value)
    assert "hint" in str(e.value)
    assert "k.py:8" in str(e.value)  # the user's line


def test_an_fp8_accumulator_is_refused(tmp_path):
    f = tmp_path / "k.py"
    f.write_text(
        "import tilenest as tn\nfrom tilenest import f32, f8e4m3fn\n\n"
        "@tn.kernel\n"
        "def k(a: tn.Tensor[f8e4m3fn, 'M K'], b: tn.Tensor[f8e4m3fn, 'K N'],"
        " c: tn.Tensor[f8e4m3fn, 'M N']):\n"
        "    m, kk = a.dims()\n"
        "    b = b.with_dims(kk, c.dim(1))\n"
        "    c = c.with_dims(m, c.dim(1))\n"
        "    for p in tn.parallel(tn.shape(1)):\n"
        "        acc = tn.zeros(f8e4m3fn, tn.shape(4, 4), dims=(m, c.dim(1)))\n"
        "        acc = tn.mma(a[tn.coord(0, 0), tn.shape(4, 4)], b[tn.coord(0, 0), tn.shape(4, 4)],"
        " acc)\n"
        "        c(tn.coord(0, 0), tn.shape(4, 4)).store(acc)\n")
    ns: dict = {}
    exec(compile(f.read_text(), str(f), "exec"), ns)
    with pytest.raises(TypeCheckError, match="accumulator is f8e4m3fn"):
        _ = ns["k"].program  # capturing the kernel type-checks it


def test_metal_refuses_fp8_naming_the_value():
    with pytest.raises(NotAvailableError) as e:
        quantize.compile("metal", device="emulated")
    msg = str(e.value)
    assert "f8e4m3fn" in msg and "'metal' target does not compile" in msg
    assert "test_fp8.py" in msg and "hint" in msg


# ---------------------------------------------------------------------------
# llvm: FP8 values are i8 bit patterns, converted in IR


@tn.kernel
def conversions(x: tn.Tensor[f32, "N"], w: tn.Tensor[tn.f64, "N"],  # noqa: F821
                c: tn.Tensor[tn.u8, "M"], s4: tn.Tensor[tn.u8, "N"],  # noqa: F821
                n4: tn.Tensor[tn.u8, "N"], s5: tn.Tensor[tn.u8, "N"],  # noqa: F821
                n5: tn.Tensor[tn.u8, "N"], w4: tn.Tensor[tn.u8, "N"],  # noqa: F821
                d4: tn.Tensor[f32, "M"], d5: tn.Tensor[f32, "M"], *, bn=64):  # noqa: F821
    """Every conversion into FP8 (both formats and policies, from f32 and
    from f64) as bits, and every code of ``c`` decoded from both formats."""
    (n,) = x.shape
    (m,) = c.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, bn))):
        o = tn.coord(p.index() * bn)
        t = x[o, tn.shape(bn), tn.bounds.zero]
        u = w[o, tn.shape(bn), tn.bounds.zero]
        s4(o, tn.shape(bn)).store(tn.bitcast(tn.cast(t, f8e4m3fn, overflow="saturate"), tn.u8))
        n4(o, tn.shape(bn)).store(tn.bitcast(tn.cast(t, f8e4m3fn, overflow="nonfinite"), tn.u8))
        s5(o, tn.shape(bn)).store(tn.bitcast(tn.cast(t, f8e5m2, overflow="saturate"), tn.u8))
        n5(o, tn.shape(bn)).store(tn.bitcast(tn.cast(t, f8e5m2, overflow="nonfinite"), tn.u8))
        w4(o, tn.shape(bn)).store(tn.bitcast(tn.cast(u, f8e4m3fn, overflow="nonfinite"), tn.u8))
    for p in tn.parallel(tn.shape(tn.cdiv(m, bn))):
        o = tn.coord(p.index() * bn)
        v = c[o, tn.shape(bn), tn.bounds.zero]
        d4(o, tn.shape(bn)).store(tn.cast(tn.bitcast(v, f8e4m3fn), f32))
        d5(o, tn.shape(bn)).store(tn.cast(tn.bitcast(v, f8e5m2), f32))


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_compiled_conversions_are_the_interpreters_bits(target):
    """Compiled (llvm; cuda on the emulator), every conversion of the dense
    f32 probe (each rounding boundary of both formats and its neighbours, the
    specials; the emulator takes every 8th probe value), the f64 values one
    f32 step would round twice, and all 256 codes of each format give
    numerics.cast's bits."""
    x = _f32_probe()
    if target == "cuda":  # every 8th value, and the whole tail of specials and NaNs
        tail = len(_PROBE_TAIL)
        x = np.concatenate([x[:-tail:8], x[-tail:]])
    kw = {"device": "emulated"} if target == "cuda" else {}
    check_conversions(conversions.compile(target, **kw), x)


def check_conversions(compiled, x):
    """Run ``conversions`` compiled on the f32 values ``x`` (and on them
    nudged in f64, and on all 256 codes) and compare with numerics.cast, bit
    for bit: NaNs included (V-24 fixes the NaN of each conversion)."""
    with np.errstate(invalid="ignore"):
        w = x.astype(np.float64) * (1 + 2.0**-40)
    c = np.arange(256, dtype=np.uint8)
    outs = [np.zeros(x.size, np.uint8) for _ in range(5)]
    dec = [np.zeros(256, np.float32), np.zeros(256, np.float32)]
    compiled(x, w, c, *outs, *dec)
    cases = [(D.f32, x, D.f8e4m3fn, "saturate"), (D.f32, x, D.f8e4m3fn, "nonfinite"),
             (D.f32, x, D.f8e5m2, "saturate"), (D.f32, x, D.f8e5m2, "nonfinite"),
             (D.f64, w, D.f8e4m3fn, "nonfinite")]
    for got, (src, v, dst, pol) in zip(outs, cases, strict=True):
        want = N.cast(v, src, dst, pol).view(np.uint8)
        bad = np.flatnonzero(got != want)
        assert not bad.size, (dst, pol, [(hex(int(np.asarray(v[i]).view(
            f"u{v.itemsize}"))), hex(got[i]), hex(want[i])) for i in bad[:4]])
    for got, dt in zip(dec, FP8, strict=True):
        want = c.view(dt.np).astype(np.float32).view(np.uint32)
        bad = np.flatnonzero(got.view(np.uint32) != want)
        assert not bad.size, (dt, [(int(i), hex(got.view(np.uint32)[i])) for i in bad[:4]])


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_fp8_kernels_validate(target):
    """The quantizing kernel (a cast with saturation, an FP8 comparison) and
    the FP8 mma, compiled (cuda: on the emulator), validate against the
    interpreter."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(100) * 200).astype(np.float32)
    rep = tn.validate(quantize, inputs=[[x, np.zeros(100, ml_dtypes.float8_e4m3fn),
                                         np.zeros(100, np.float32)]], target=target)
    assert rep.ok and rep.count("ok") == 1, rep.summary()
    a = rng.standard_normal((9, 20)).astype(ml_dtypes.float8_e5m2)
    b = rng.standard_normal((20, 11)).astype(ml_dtypes.float8_e4m3fn)
    rep = tn.validate(fp8_mma, inputs=[[a, b, np.zeros((9, 11), np.float32)]], target=target)
    assert rep.ok and rep.count("ok") == 1, rep.summary()


def test_nvrtc_compiles_the_fp8_conversions_to_instructions():
    """The generated CUDA of the FP8 kernels builds for the device (sm_90a)
    with NVRTC, and there the conversions are the pair instructions (the
    emulator runs the prelude's integer code instead; the device test checks
    both give the same bits): every narrowing of ``conversions`` (both
    formats and policies) is a ``cvt.rn.satfinite`` into e4m3x2 or e5m2x2.
    Widening is integer code and one multiply on both."""
    from tilenest.backends import cuda
    from tilenest.lowering.schedule import default_schedule

    for k in (conversions, quantize, fp8_mma):
        src = cuda.stage_source(k.program, default_schedule(k.program, "cuda"))[1]
        assert "tn_narrow_f8" in src.text or "tn_widen" in src.text
        built = cuda._build(src, want_ptx=True, cache=False)
        assert built is not None
        if k is conversions:
            for ins in ("cvt.rn.satfinite.e4m3x2.f32", "cvt.rn.satfinite.e5m2x2.f32"):
                assert ins in built.ptx, ins
            assert "cvt.rn.f16x2.e4m3x2" not in built.ptx


@tn.kernel
def quantize_rows(x: tn.Tensor[f32, "R C"], q: tn.Tensor[f8e4m3fn, "R C"],  # noqa: F821
                  back: tn.Tensor[f32, "R C"], scale: tn.Scalar[f32]):  # noqa: F821
    """Each row scaled into e4m3fn (saturating) and decoded back, unscaled."""
    rows, cols = x.shape
    q = q.with_dims(*x.dims())
    back = back.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        y = tn.cast(x[o, tn.shape(1, cols)] * scale, f8e4m3fn, overflow="saturate")
        q(o, tn.shape(1, cols)).store(y)
        back(o, tn.shape(1, cols)).store(tn.cast(y, f32) / scale)


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_generated_inputs_validate_an_fp8_kernel(target):
    """tn.validate draws its own inputs for FP8 tensors (special values
    included) and poisons unwritten FP8 memory with NaN."""
    rep = tn.validate(quantize_rows, target, cases=4, seed=1)
    assert rep.ok and rep.count("ok") == 4, rep.summary()


@pytest.mark.parametrize("level", ["x86-64-v3", "x86-64-v4"])
def test_llvm_fp8_conversion_loops_are_vector_code(level):
    """The rows' conversions run as lane-wise integer code: the loop that
    rounds into e4m3fn and the one that widens it back are vector loops of
    the host width (8 or 16 lanes of f32 into as many bytes)."""
    from tilenest.backends.llvm import compile_program, jit
    from tilenest.lowering import default_schedule

    bits = {"x86-64-v3": 256, "x86-64-v4": 512}[level]
    lanes = bits // 32
    h = jit.host()
    s = default_schedule(quantize_rows.program, "llvm", vector_bits=bits)
    ir = compile_program(quantize_rows.program, s, cache=False,
                         host=jit.Host(h.triple, level, "")).llvm_ir
    assert f"<{lanes} x i8>" in ir and f"fmul <{lanes} x float>" in ir
    assert f"zext <{lanes} x i8>" in ir  # the widening, lane-wise


@pytest.mark.device
def test_fp8_conversions_on_the_gpu():
    """On a CUDA GPU: every conversion of the dense probe and all 256 codes
    of each format are numerics.cast's bits, and the FP8 kernels validate."""
    from tilenest.backends import cuda

    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    check_conversions(conversions.compile("cuda", device="gpu"), _f32_probe())
    for k in (quantize_rows, fp8_mma):
        ck = cuda.compile_program(k.program, None, device="gpu")
        rep = tn.validate(k, "cuda", compiled=ck, cases=4, seed=2)
        assert rep.ok and rep.count("ok") == 4, rep.summary()


@pytest.mark.device
@pytest.mark.parametrize("kernel", ["fp8_gemm", "mixed_nt"])
def test_fp8_tensor_core_products_on_the_gpu(kernel):
    """On a CUDA GPU: the FP8 products on mma.sync.m16n8k32 are admitted by
    the oracle (V-24's accumulation), over the validator's shape classes."""
    from tilenest.backends import cuda
    from tilenest.bench.kernels import kernels

    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    k = kernels()["fp8_gemm"] if kernel == "fp8_gemm" else mixed_nt
    ck = cuda.compile_program(k.program, None, device="gpu")
    assert "tn_mma_e" in ck.source.text
    rep = tn.validate(k, "cuda", compiled=ck, cases=12, seed=4)
    assert rep.ok and rep.count("ok") == 12, rep.summary()


def test_a_reassociating_fp8_mma_admits_the_matrix_units_narrower_sums():
    """1 plus 31 products 2^-16: an H200's FP8 tensor cores return 1.0 (their
    accumulator keeps 14 significant bits, benchmarks/fp8_accumulation.py).
    A reassociating FP8 ``mma`` admits that; a strict one, or the same values
    as bf16 operands (f32 sums), do not."""
    a = np.zeros((16, 32), np.float32)
    b = np.zeros((32, 16), np.float32)
    a[:, 0], b[0, :] = 1.0, 1.0
    a[:, 1:], b[1:, :] = 2.0 ** -8, 2.0 ** -8
    c = np.zeros((16, 16), np.float32)
    qa, qb = a.astype(f8e4m3fn.np), b.astype(f8e4m3fn.np)
    lost = np.ones((16, 16), np.float32)  # every small product truncated away
    exact = np.full((16, 16), 1.0 + 31 * 2.0 ** -16, np.float32)
    adm = tn.reference(one_mma(f8e4m3fn, f8e4m3fn), qa, qb, c)
    assert adm.admits(exact) and adm.admits(lost)
    # each of the 2 (K + 1) faithful roundings may lose 2^-14 of the sum: no more
    total = 1 + 31 * 2.0 ** -16
    bound = 66 * 2.0 ** -14 / (1 - 66 * 2.0 ** -14) * total
    assert adm.admits(np.full((16, 16), total - 0.9 * bound, np.float32))
    assert not adm.admits(np.full((16, 16), total - 1.1 * bound, np.float32))
    strict = tn.reference(one_mma(f8e4m3fn, f8e4m3fn, False), qa, qb, c)
    assert strict.admits(exact) and not strict.admits(lost)

    wide = tn.reference(one_mma(tn.bf16, tn.bf16), a.astype(tn.bf16.np), b.astype(tn.bf16.np), c)
    assert wide.admits(exact) and not wide.admits(lost)


@tn.kernel
def mixed_nt(a: tn.Tensor[f8e5m2, "M K"], bt: tn.Tensor[f8e4m3fn, "N K"],  # noqa: F821
             c: tn.Tensor[f32, "M N"], *, bm=32, bn=32, bk=32):  # noqa: F821
    """c = a bt^T over tiles: an e5m2 x e4m3fn product, both operands
    contiguous along the contraction."""
    M, K = a.shape
    N = bt.shape[0]
    m, k = a.dims()
    n = c.dim(1)
    bt = bt.with_dims(n, k)
    c = c.with_dims(m, n)
    for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
        i, j = p.index(0), p.index(1)
        acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
        for kk in p.serial(tn.shape(tn.cdiv(K, bk))):
            x = a[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
            w = bt[tn.coord(j * bn, kk.index() * bk), tn.shape(bn, bk), tn.bounds.zero]
            acc = tn.mma(x, w, acc, allow_reassociation=True)
        c(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(acc)


@pytest.mark.parametrize("kernel", ["fp8_gemm", "mixed_nt"])
def test_fp8_mma_runs_on_tensor_cores(kernel):
    """An FP8 ``mma`` whose operands are both contiguous along the contraction
    runs as ``mma.sync.m16n8k32`` (the generated CUDA calls the FP8 tensor-core
    function of its formats; NVRTC's PTX holds the instruction) and validates
    against the interpreter on the emulated device."""
    from tilenest.backends import cuda
    from tilenest.bench.kernels import kernels
    from tilenest.lowering.schedule import default_schedule

    k = kernels()["fp8_gemm"] if kernel == "fp8_gemm" else mixed_nt
    fn, ins = (("tn_mma_e4m3_e4m3", "f32.e4m3.e4m3.f32") if kernel == "fp8_gemm"
               else ("tn_mma_e5m2_e4m3", "f32.e5m2.e4m3.f32"))
    s = default_schedule(k.program, "cuda")
    src = cuda.stage_source(k.program, s)[1]
    assert fn in src.text
    ptx = cuda._build(src, want_ptx=True, cache=False).ptx
    assert f"mma.sync.aligned.m16n8k32.row.col.{ins}" in ptx
    ck = cuda.compile_program(k.program, s, device="emulated")
    rep = tn.validate(k, "cuda", compiled=ck, cases=4, seed=3)
    assert rep.ok and rep.count("ok") == 4, rep.summary()


def test_fp8_tensor_cores_need_both_operands_along_the_contraction():
    """b stored K x N (contiguous along its free dim) cannot be read by the
    8-bit fragments: asked for tensor cores (mma.sync or wgmma), the refusal
    says why; the automatic choice runs it on the SIMT units."""
    from tilenest.lowering import lower_verified
    from tilenest.lowering.loopir import print_kernel
    from tilenest.lowering.schedule import default_schedule

    @tn.kernel
    def nn(a: tn.Tensor[f8e4m3fn, "M K"], b: tn.Tensor[f8e4m3fn, "K N"],  # noqa: F821
           c: tn.Tensor[f32, "M N"]):  # noqa: F821
        m, k = a.dims()
        b = b.with_dims(k, c.dim(1))
        c = c.with_dims(m, c.dim(1))
        for _p in tn.parallel(tn.shape(1)):
            acc = tn.zeros(f32, tn.shape(32, 32), dims=(m, c.dim(1)))
            acc = tn.mma(a[tn.coord(0, 0), tn.shape(32, 32)], b[tn.coord(0, 0), tn.shape(32, 32)],
                         acc, allow_reassociation=True)
            c(tn.coord(0, 0), tn.shape(32, 32)).store(acc)

    with pytest.raises(tn.errors.TilenestError, match="along the contraction") as e:
        lower_verified(nn.program, default_schedule(nn.program, "cuda", mma_unit="tensor"))
    assert "test_fp8.py" in str(e.value)
    assert "mma on the SIMT units" in print_kernel(
        lower_verified(nn.program, default_schedule(nn.program, "cuda")))
    with pytest.raises(tn.errors.TilenestError, match="along the contraction"):
        lower_verified(nn.program, default_schedule(nn.program, "cuda", mma_unit="wgmma",
                                                    block_threads=128))
