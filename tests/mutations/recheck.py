"""Independent re-checks of counterexamples.

Each function takes a refuted obligation and confirms its counterexample by
evaluating the *original* objects -- the transform's ``tau`` and domains, an
op's view map and region domains, a binding map, an issue schedule, numpy
arithmetic -- never the claim formula the solver saw. They return a short
description of what was confirmed, and raise AssertionError otherwise."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from tilenest.proofs.model import Access, Model
from tilenest.proofs.obligation import Obligation
from tilenest.semantics import expr as E
from tilenest.semantics.ir import Operation, TileProgram


def env_of(p: TileProgram, cx: dict) -> dict:
    env: dict = {}
    for k, v in cx.items():
        if isinstance(v, (int, np.integer)):
            env[E.Sym(k) if k in p.syms else E.Var(k)] = int(v)
    return env


def holds(x: Any, env: dict) -> bool:
    return bool(E.evaluate(x, env))


# -- remaps --------------------------------------------------------------------

def _remap_parts(ob: Obligation) -> tuple[Any, TileProgram, list[Operation]]:
    r, p = ob.witness["remap"], ob.witness["program"]
    m = Model(p)
    ops = [m.level_op(lv) for lv in r.chain]
    return r, p, ops


def _new_env(r: Any, cx: dict, primes: int, base: dict) -> dict:
    env = dict(base)
    for lv in r.new:
        for v in lv.vars:
            env[E.Var(v)] = cx[v + "'" * primes]
    return env


def _tau(r: Any, env: dict, old_vars: list[str]) -> tuple[int, ...]:
    return tuple(int(E.evaluate(r.tau[v], env)) for v in old_vars)


def _old_active(ops: list[Operation], env: dict) -> bool:
    return all(holds(op.attrs["domain"].constraint(), env) for op in ops)


def _new_active(r: Any, env: dict) -> bool:
    return all(holds(lv.domain.constraint(), env) for lv in r.new)


def remap(ob: Obligation) -> str:
    r, p, ops = _remap_parts(ob)
    cx = ob.counterexample
    base = env_of(p, {k: v for k, v in cx.items() if "'" not in k})
    old_vars = [v for op in ops for v in op.attrs["vars"]]
    if ob.kind == "tau.function":
        env = _new_env(r, cx, 1, base)
        assert _new_active(r, env), "the new point is not active"
        old = _tau(r, env, old_vars)
        env2 = dict(base)
        env2.update({E.Var(v): x for v, x in zip(old_vars, old, strict=True)})
        assert not _old_active(ops, env2), f"tau gives {old}, inside the old domain"
        return f"tau maps an active new point to {old}, outside the old domain"
    if ob.kind == "tau.cover":
        assert _old_active(ops, base), "the old point is not active"
        target = tuple(base[E.Var(v)] for v in old_vars)
        # enumerate the new nest at these parameters: no active point maps to target
        boxes = []
        for lv in r.new:
            for f in lv.domain.space.factors:
                ext = int(E.evaluate(f.extent, base)) if not (E.leaves(f.extent) - set(base)) \
                    else 64
                boxes.append(range(max(0, ext)))
        names = [v for lv in r.new for v in lv.vars]
        assert np.prod([len(b) for b in boxes]) < 200_000
        for pt in itertools.product(*boxes):
            env = dict(base)
            env.update({E.Var(v): x for v, x in zip(names, pt, strict=True)})
            if _new_active(r, env) and _tau(r, env, old_vars) == target:
                raise AssertionError(f"new point {pt} does map to {target}")
        return f"no active new point maps to the old point {target}"
    if ob.kind == "tau.injective":
        e1, e2 = _new_env(r, cx, 1, base), _new_env(r, cx, 2, base)
        assert _new_active(r, e1) and _new_active(r, e2)
        names = [v for lv in r.new for v in lv.vars]
        assert any(e1[E.Var(v)] != e2[E.Var(v)] for v in names), "the two points are equal"
        assert _tau(r, e1, old_vars) == _tau(r, e2, old_vars)
        return "two distinct active new points map to one old point"
    if ob.kind in ("cut.factor", "cut.identity"):
        e1, e2 = _new_env(r, cx, 1, base), _new_env(r, cx, 2, base)
        assert _new_active(r, e1) and _new_active(r, e2)
        lid = int(ob.title.split("level-")[1].split(" ")[0])
        k = int(ob.title.split("level ")[-1].split()[0]) if ob.kind == "cut.factor" else \
            int(ob.title.split("new level-")[1].split(" ")[0])
        nk = sum(len(lv.vars) for lv in r.new[:k + 1])
        names = [v for lv in r.new for v in lv.vars][:nk]
        j = [op.attrs["level"] for op in ops].index(lid)
        nj = sum(len(op.attrs["vars"]) for op in ops[:j + 1])
        same_prefix = all(e1[E.Var(v)] == e2[E.Var(v)] for v in names)
        same_old = _tau(r, e1, old_vars)[:nj] == _tau(r, e2, old_vars)[:nj]
        if ob.kind == "cut.factor":
            assert same_prefix and not same_old
            return "a shared new prefix maps to two old ancestors"
        assert same_old and not same_prefix
        return "two new prefixes claim one old identity"
    raise AssertionError(f"no recheck for {ob.kind}")


# -- accesses --------------------------------------------------------------------

def access_env(p: TileProgram, acc: Access, cx: dict, suffix: str) -> dict:
    """Original variable names of ``acc``'s op bound from the counterexample."""
    m = Model(p)
    env = env_of(p, {k: v for k, v in cx.items() if k in p.syms})
    ren = m.renaming(acc.op, suffix, set(acc.inst.vars) - {
        v for v in acc.inst.vars if v.endswith(suffix) and suffix})
    for orig, new in ren.items():
        if new in cx:
            env[E.Var(orig)] = cx[new]
        elif orig in cx:
            env[E.Var(orig)] = cx[orig]
    if acc.op.name.startswith("tensor."):
        for v, u in zip(acc.op.attrs["vars"], acc.local, strict=True):
            env[E.Var(v)] = cx[u]
    return env


def element(acc: Access, env: dict, p: TileProgram, cx: dict) -> tuple[int, ...]:
    if acc.op.name.startswith("tensor."):
        return tuple(int(E.evaluate(x, env)) for x in acc.op.attrs["map"])
    return tuple(int(cx[x.name]) if isinstance(x, E.Var) and x.name in cx else
                 int(E.evaluate(x, env)) for x in acc.elem)


def active(p: TileProgram, op: Operation, env: dict) -> bool:
    m = Model(p)
    for r in m.regions_of(op):
        if r.name in ("parallel", "serial", "pipeline", "reduce"):
            if not holds(r.attrs["domain"].constraint(), env):
                return False
    return True


def two_accesses(ob: Obligation, p: TileProgram) -> str:
    a, b = ob.witness["a"], ob.witness["b"]
    cx = ob.counterexample
    ea = access_env(p, a, cx, "")
    eb = access_env(p, b, cx, "'" if "'" in "".join(b.inst.vars + b.local) else "")
    assert active(p, a.op, ea) and active(p, b.op, eb), "an instance is not active"
    xa, xb = element(a, ea, p, cx), element(b, eb, p, cx)
    assert xa == xb, f"different elements {xa} and {xb}"
    assert a.write or b.write
    if a.op.name.startswith("tensor."):
        shape = [int(E.evaluate(s, ea)) for s in a.op.operands[0].type.shape]
        assert all(0 <= x < n for x, n in zip(xa, shape, strict=True)), "element outside"
    return f"both accesses touch {a.target[1]}{list(xa)}, one writing"


def serial_edge(ob: Obligation, p: TileProgram) -> str:
    """Both accesses touch one element, and B's iteration runs before A's."""
    what = two_accesses(ob, p)
    a, b = ob.witness["a"], ob.witness["b"]
    cx = ob.counterexample
    ra = next(r for r in Model(p).regions_of(a.op) if r.name == "serial")
    rb = next(r for r in Model(p).regions_of(b.op) if r.name == "serial")
    i = tuple(cx[v] for v in ra.attrs["vars"])
    j = tuple(cx[v + "'"] for v in rb.attrs["vars"])
    assert (i < j) if ra.attrs["order"] == "reverse" else (j < i), (i, j)
    return f"{what}; B{list(j)} runs before A{list(i)} once fused"


def layout(ob: Obligation) -> str:
    """Evaluate the Memory's own layout at the counterexample."""
    mt = ob.witness["type"]
    cx = ob.counterexample
    env = {E.Sym(k): int(v) for k, v in cx.items() if "'" not in k and not k.isdigit()}
    ext = [int(E.evaluate(x, env)) for x in mt.space.extents]
    names = list(mt.layout.vars)

    def at(suffix: str) -> tuple[tuple[int, ...], int]:
        pt = tuple(int(cx[v + suffix]) for v in names)
        assert all(0 <= c < n for c, n in zip(pt, ext, strict=True)), (pt, ext)
        e = dict(env)
        e.update({E.Var(v): c for v, c in zip(names, pt, strict=True)})
        return pt, int(E.evaluate(mt.layout.offset, e))

    u, off_u = at("")
    if ob.kind == "layout.injective":
        v, off_v = at("'")
        assert u != v and off_u == off_v
        return f"elements {u} and {v} share offset {off_u}"
    size = int(E.evaluate(mt.layout.size, env))
    assert not 0 <= off_u < size
    return f"element {u} maps to {off_u}, outside [0, {size})"


def bounds(ob: Obligation, p: TileProgram) -> str:
    a = ob.witness["a"]
    env = access_env(p, a, ob.counterexample, "")
    assert active(p, a.op, env)
    x = element(a, env, p, ob.counterexample)
    shape = [int(E.evaluate(s, env)) for s in a.op.operands[0].type.shape]
    assert any(not 0 <= v < n for v, n in zip(x, shape, strict=True)), f"{x} is inside {shape}"
    return f"access {list(x)} lies outside shape {shape}"


def run_at(p: TileProgram, cx: dict, fill: float = np.nan) -> dict[str, np.ndarray]:
    """Run the interpreter at the counterexample's parameter values."""
    import tilenest as tn

    arrays = []
    for v in p.args:
        shape = tuple(int(E.evaluate(s, env_of(p, cx))) for s in v.type.shape)
        arrays.append(np.full(shape, fill, dtype=v.type.dtype.np) if v.type.dtype.is_float
                      else np.zeros(shape, dtype=v.type.dtype.np))
    for a in arrays:
        if a.dtype.kind == "f":
            a[...] = np.where(np.isnan(a), np.float32(1.0), a)
    stored = {op.operands[0].name for op in p.walk() if op.name == "tensor.store"}
    for v, a in zip(p.args, arrays, strict=True):
        if v.name in stored and a.dtype.kind == "f":
            a[...] = fill
    tn.interpret(p, *arrays)
    return {v.name: a for v, a in zip(p.args, arrays, strict=True)}


def race_at(ob: Obligation, p: TileProgram) -> str:
    """Running the interpreter at the counterexample's sizes reports a race."""
    from tilenest.errors import RaceError

    try:
        run_at(p, ob.counterexample)
    except RaceError as e:
        return f"the interpreter reports the race: {e.message}"
    raise AssertionError("the interpreter ran the counterexample's sizes without a race")


def cover(ob: Obligation, p: TileProgram) -> str:
    cx = ob.counterexample
    rank = len([k for k in cx if k.startswith("e@")])
    idx = tuple(int(cx[f"e@{d}"]) for d in range(rank))
    out = run_at(p, cx)[ob.witness["tensor"]]
    assert np.isnan(out[idx]), f"element {idx} was written"
    return f"running at the counterexample leaves {ob.witness['tensor']}{list(idx)} unwritten"


# -- bindings, schedules, laws ------------------------------------------------------

def binding(ob: Obligation, p: TileProgram) -> str:
    cx = ob.counterexample
    env = env_of(p, cx)
    w = ob.witness
    if ob.kind == "binding.projection":
        bk = [int(E.evaluate(x, env)) for x in w["beta_k"][:len(w["beta_j"])]]
        bj = [int(E.evaluate(x, env)) for x in w["beta_j"]]
        assert bk != bj
        return f"beta_k puts the instance under {bk}, beta_j under {bj}"
    if ob.kind == "binding.unique":
        i1 = [int(E.evaluate(x, env)) for x in w["image"]]
        i2 = [int(E.evaluate(x, env)) for x in w["image2"]]
        assert i1 == i2 and [cx[v] for v in w["xs"]] != [cx[v] for v in w["ys"]]
        return f"two instances share participant {i1}"
    if ob.kind == "binding.limit":
        n = int(E.evaluate(w["count"], env))
        assert n > w["limit"]
        return f"{n} participants > {w['limit']}"
    raise AssertionError(ob.kind)


def schedule(ob: Obligation) -> str:
    sch = ob.witness["schedule"]
    i = ob.counterexample["i@"]
    (s_late, d_late), (s_early, d_early) = ob.witness["later"], ob.witness["earlier"]
    t_late = (i + d_late) * sch.interval + sch.offsets[s_late]
    done = (i + d_early) * sch.interval + sch.offsets[s_early] + sch.latency[s_early]
    assert t_late < done
    return f"issue {t_late} precedes completion {done}"


def float_assoc(ob: Obligation) -> str:
    cx = ob.counterexample
    a, b, c = (np.float32(cx[k][0]) for k in ("a", "b", "c"))
    lhs, rhs = (a + b) + c, a + (b + c)
    assert lhs.tobytes() != rhs.tobytes()
    return f"numpy float32: ({a} + {b}) + {c} = {lhs} != {rhs}"


def placement(ob: Obligation) -> str:
    cx = ob.counterexample
    w = ob.witness
    env = env_of_syms(cx)
    r = w["r"]
    p1 = int(E.evaluate(r(E.Const(cx["p@"]), E.Const(cx["s@"])), env))
    if ob.kind == "reduction.order":
        p2 = int(E.evaluate(r(E.Const(cx["p@'"]), E.Const(cx["s@'"])), env))
        assert (cx["p@"], cx["s@"]) < (cx["p@'"], cx["s@'"]) and p1 >= p2
        return f"placed contributions {p1} and {p2} are out of order"
    raise AssertionError(ob.kind)


def env_of_syms(cx: dict) -> dict:
    return {E.Sym(k): int(v) for k, v in cx.items() if isinstance(v, int) and "@" not in k}
