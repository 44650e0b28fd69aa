"""Bit-linear index maps: a decision procedure over GF(2).

An index expression built from coordinates, non-negative constants, XOR,
AND/OR with a constant, shifts by a constant, multiplication, floor division
and modulo by a power of two, and *carry-free* sums (sums and ORs whose
operands can never have a set bit in common) is, on non-negative coordinates of
bounded width, an affine map over GF(2)::

    f(x) = c  XOR  XOR_{k : bit k of x is set}  col[k]

where ``x`` is the concatenation of the coordinates' bits (coordinate ``v``
with extent ``n_v`` owns ``w_v = ceil(log2 n_v)`` bits, least significant
first) and ``col[k]`` is the output pattern contributed by input bit ``k``.
This is the form of the XOR swizzles GPU shared-memory layouts use (CUTLASS
``Swizzle<B, M, S>``: ``o ^ ((o & (2^B - 1) << (M + S)) >> S)`` over a dense
offset ``o``).

:func:`bit_linear` extracts ``(c, col)`` structurally and returns ``None`` for
anything else: a product of two coordinates, a subtraction, a sum whose
operands may carry, a symbol, a data value, or any intermediate value that
could reach bit 62 (signed 64-bit index arithmetic must not overflow). The
extraction is exact on the whole enclosing power-of-two box
``prod_v [0, 2^w_v)``, not only at sampled points; evaluating the map at the
unit vectors alone would not establish linearity.

Facts decided on the declared box ``B = prod_v [0, n_v)``:

* **injectivity** -- ``f(x) = f(y)`` iff ``col * (x XOR y) = 0``. Every
  ``w``-bit delta is the XOR of two points of ``[0, n)`` (``(d, 0)`` when
  ``d < n``, else ``(2^(w-1), d XOR 2^(w-1))``), and the box is a product, so
  ``f`` is injective on ``B`` -- ragged or not -- iff the columns are linearly
  independent (full column rank). A kernel vector gives a colliding pair of
  points of ``B`` (:meth:`BitMap.collision`);
* **maximum** -- the image of a power-of-two box is the affine subspace
  ``c XOR span(col)``; its largest element and a preimage come from a basis
  reduced by leading bit. A ragged box is a union of few products of dyadic
  intervals, on each of which the map is again affine, so the maximum over
  ``B`` is exact and attained (:meth:`BitMap.maximum`). Every value is
  non-negative by construction, so this decides ``0 <= f < size``.

Gaussian elimination uses Python integers as bit rows, so maps wider than 64
input or output bits cost nothing extra.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..semantics import expr as E

#: no intermediate value may have a bit at or above this position (int64 safety)
MAX_BITS = 62


def width(extent: int) -> int:
    """Bits of a coordinate in ``[0, extent)``: ``ceil(log2(extent))`` (0 for
    extents 0 and 1)."""
    return max(0, int(extent) - 1).bit_length()


@dataclass(frozen=True)
class _Lin:
    """An intermediate: ``value(x) = const XOR XOR_k x_k * cols[k]``."""

    cols: tuple[int, ...]
    const: int

    @property
    def support(self) -> int:
        """Every output bit that can be set for some input (a superset)."""
        s = self.const
        for c in self.cols:
            s |= c
        return s

    def map(self, f: Callable[[int], int]) -> _Lin:
        """Apply one bitwise-linear operation to every column and the constant."""
        return _Lin(tuple(f(c) for c in self.cols), f(self.const))


@dataclass(frozen=True)
class BitMap:
    """An affine map over GF(2) on a box of coordinates (see the module
    docstring): ``vars`` with bit ``widths``, ``cols`` one output pattern per
    input bit (variable-major, least significant bit first), ``const`` the
    image of the origin."""

    vars: tuple[str, ...]
    widths: tuple[int, ...]
    cols: tuple[int, ...]
    const: int

    @property
    def n_inputs(self) -> int:
        return len(self.cols)

    def __call__(self, point: Sequence[int]) -> int:
        """``f(point)`` from the matrix (not from the expression)."""
        out = self.const
        for k, bit in enumerate(self._bits(point)):
            if bit:
                out ^= self.cols[k]
        return out

    def _bits(self, point: Sequence[int]) -> list[int]:
        bits: list[int] = []
        for x, w in zip(point, self.widths, strict=True):
            bits.extend((int(x) >> i) & 1 for i in range(w))
        return bits

    def _split(self, delta: int) -> list[int]:
        """Input-bit vector -> per-variable values."""
        out, pos = [], 0
        for w in self.widths:
            out.append((delta >> pos) & ((1 << w) - 1))
            pos += w
        return out

    def rank(self) -> int:
        """The rank over GF(2) of the column set."""
        return len(_basis(self.cols)[0])

    def kernel_vector(self) -> int | None:
        """A nonzero input-bit vector ``d`` with ``col * d = 0``, or ``None`` when
        the columns are independent (full column rank)."""
        return _basis(self.cols)[1]

    def collision(self, extents: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Two distinct points of the box ``prod [0, extents)`` with equal
        images, or ``None`` when ``f`` is injective on the box."""
        d = self.kernel_vector()
        if d is None:
            return None
        xs, ys = [], []
        for di, n, w in zip(self._split(d), extents, self.widths, strict=True):
            if di < n:
                xs.append(di)
                ys.append(0)
            else:  # di has bit w-1 set: both halves lie below n
                top = 1 << (w - 1)
                xs.append(top)
                ys.append(di ^ top)
        return tuple(xs), tuple(ys)

    def maximum(self, extents: Sequence[int] | None = None) -> tuple[int, tuple[int, ...]]:
        """The largest image and one preimage of it: over the enclosing
        power-of-two box, or with ``extents`` exactly over ``prod [0, n_v)``.

        A ragged ``[0, n)`` is the disjoint union of the dyadic intervals
        ``[n_k, n_k + 2^k)`` for each set bit ``k`` of ``n`` (``n_k`` = ``n``
        with bits ``0..k`` cleared). On a product of dyadic intervals the high
        bits are fixed and the low ones free, so the map is again affine over
        GF(2) and its maximum is attained there; the box's maximum is the
        largest of these (at most ``prod popcount(n_v)`` pieces)."""
        if extents is None:
            return self._max_affine(self.const, self.cols, [0] * len(self.widths),
                                    list(self.widths))
        best: tuple[int, tuple[int, ...]] | None = None
        pieces = [_dyadic(int(n)) for n in extents]
        for choice in itertools.product(*pieces):
            bases = [b for b, _ in choice]
            free = [k for _, k in choice]
            const = self(bases)
            cols: list[int] = []
            pos = 0
            for w, k in zip(self.widths, free, strict=True):
                cols.extend(self.cols[pos:pos + k])
                pos += w
            got = self._max_affine(const, cols, bases, free)
            if best is None or got[0] > best[0]:
                best = got
        assert best is not None, "maximum of an empty box"
        return best

    @staticmethod
    def _max_affine(const: int, cols: Sequence[int], bases: Sequence[int],
                    free: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        """Max of ``const XOR span(cols)`` and the point ``bases + low bits``."""
        basis = _reduced(cols)
        v, combo = const, 0
        for lead in sorted(basis, reverse=True):
            if not (v >> lead) & 1:
                bv, bc = basis[lead]
                v ^= bv
                combo ^= bc
        point, pos = [], 0
        for b, k in zip(bases, free, strict=True):
            point.append(b | ((combo >> pos) & ((1 << k) - 1)))
            pos += k
        return v, tuple(point)


def _dyadic(n: int) -> list[tuple[int, int]]:
    """``[0, n)`` as dyadic intervals ``(base, k)`` = ``[base, base + 2^k)``."""
    out = []
    for k in range(n.bit_length()):
        if (n >> k) & 1:
            out.append((n & ~((1 << (k + 1)) - 1), k))
    return out


def _basis(cols: Sequence[int]) -> tuple[dict[int, tuple[int, int]], int | None]:
    """Row-reduce ``cols`` by leading bit, tracking which inputs each basis
    vector combines. Returns the basis and the first dependency found (a
    nonzero input combination mapping to 0), if any."""
    basis: dict[int, tuple[int, int]] = {}
    dep: int | None = None
    for k, col in enumerate(cols):
        v, combo = col, 1 << k
        while v:
            lead = v.bit_length() - 1
            if lead not in basis:
                basis[lead] = (v, combo)
                break
            bv, bc = basis[lead]
            v ^= bv
            combo ^= bc
        else:
            if dep is None:
                dep = combo
    return basis, dep


def _reduced(cols: Sequence[int]) -> dict[int, tuple[int, int]]:
    """A basis where each leading bit is set in its own vector only."""
    basis = _basis(cols)[0]
    leads = sorted(basis)
    for lead in leads:
        v, c = basis[lead]
        for other in leads:
            if other != lead:
                ov, oc = basis[other]
                if (ov >> lead) & 1:
                    basis[other] = (ov ^ v, oc ^ c)
    return basis


def _pow2(e: E.Expr) -> int | None:
    """``k`` when ``e`` is the constant ``2^k``."""
    if isinstance(e, E.Const) and e.value > 0 and e.value & (e.value - 1) == 0:
        return e.value.bit_length() - 1
    return None


class _Extract:
    def __init__(self, vars_: Sequence[str], widths: Sequence[int]):
        self.pos: dict[str, tuple[int, int]] = {}
        p = 0
        for v, w in zip(vars_, widths, strict=True):
            self.pos[v] = (p, w)
            p += w
        self.n = p
        self.limit = 1 << MAX_BITS

    def ok(self, x: _Lin | None) -> _Lin | None:
        if x is None or x.support >= self.limit:
            return None
        return x

    def const(self, c: int) -> _Lin:
        return _Lin((0,) * self.n, c)

    def expr(self, e: E.Expr) -> _Lin | None:
        if isinstance(e, E.Const):
            return self.ok(self.const(e.value)) if e.value >= 0 else None
        if isinstance(e, E.Var):
            if e.name not in self.pos:
                return None
            p, w = self.pos[e.name]
            cols = [0] * self.n
            for i in range(w):
                cols[p + i] = 1 << i
            return _Lin(tuple(cols), 0)
        if isinstance(e, E.Add):
            parts = [self.expr(t) for t in e.terms]
            return self.ok(self._disjoint_sum(parts))
        if isinstance(e, E.Mul):
            k = 0
            rest: list[E.Expr] = []
            for f in e.factors:
                s = _pow2(f)
                if s is None:
                    rest.append(f)
                else:
                    k += s
            if len(rest) != 1:
                return None if rest or k else self.const(1)
            a = self.expr(rest[0])
            return self.ok(None if a is None else a.map(lambda c: c << k))
        if isinstance(e, (E.FloorDiv, E.Mod)):
            k = _pow2(e.b)
            a = self.expr(e.a)
            if k is None or a is None:
                return None
            if isinstance(e, E.FloorDiv):
                return a.map(lambda c: c >> k)
            return a.map(lambda c: c & ((1 << k) - 1))
        if isinstance(e, E.BitOp):
            return self.ok(self._bitop(e))
        return None  # Sym, Val, MinMax: not bit-linear

    def _disjoint_sum(self, parts: list[_Lin | None]) -> _Lin | None:
        if any(p is None for p in parts):
            return None
        seen = 0
        cols = [0] * self.n
        const = 0
        for p in parts:
            assert p is not None
            s = p.support
            if s & seen:
                return None  # a carry is possible
            seen |= s
            cols = [a ^ b for a, b in zip(cols, p.cols, strict=True)]
            const ^= p.const
        return _Lin(tuple(cols), const)

    def _bitop(self, e: E.BitOp) -> _Lin | None:
        op = e.op
        if op in ("<<", ">>"):
            if not isinstance(e.b, E.Const) or e.b.value < 0 or e.b.value > MAX_BITS:
                return None
            a = self.expr(e.a)
            if a is None:
                return None
            k = e.b.value
            return a.map((lambda c: c << k) if op == "<<" else (lambda c: c >> k))
        a, b = self.expr(e.a), self.expr(e.b)
        if a is None or b is None:
            return None
        if op == "^":
            return _Lin(tuple(x ^ y for x, y in zip(a.cols, b.cols, strict=True)),
                        a.const ^ b.const)
        ca, cb = not any(a.cols), not any(b.cols)
        if op == "&":
            if ca or cb:
                m, x = (a.const, b) if ca else (b.const, a)
                return x.map(lambda c: c & m)
            return None
        if op == "|":
            if ca or cb:
                m, x = (a.const, b) if ca else (b.const, a)
                return _Lin(tuple(c & ~m for c in x.cols), (x.const & ~m) | m)
            return self._disjoint_sum([a, b])
        return None


def bit_linear(offset: E.Expr, vars_: Sequence[str], extents: Sequence[int]) -> BitMap | None:
    """The GF(2) form of ``offset`` over coordinates ``vars_`` in
    ``prod [0, extents)`` (see the module docstring), or ``None`` when the
    expression is not bit-linear by the structural rules."""
    widths = tuple(width(n) for n in extents)
    ex = _Extract(vars_, widths)
    lin = ex.expr(offset)
    if lin is None:
        return None
    return BitMap(tuple(vars_), widths, lin.cols, lin.const)


def evaluate(offset: E.Expr, vars_: Sequence[str], point: Sequence[int],
             env: Mapping[E.Expr, int] | None = None) -> int:
    """``offset`` at ``point`` by the expression semantics (the independent
    check of every GF(2) verdict)."""
    full = dict(env or {})
    full.update({E.Var(v): int(x) for v, x in zip(vars_, point, strict=True)})
    return int(E.evaluate(offset, full))
