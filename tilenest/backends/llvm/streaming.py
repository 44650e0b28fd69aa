"""Streaming (non-temporal) stores of large outputs.

A row kernel writes its output once and never reads it back. An ordinary
store first reads the cache line it writes into (so the line can be merged
in the cache), and the line then pushes out data the kernel still reads; for
an output larger than the caches both are wasted traffic. A *streaming*
store (x86 ``vmovntps`` and its kin, LLVM's ``!nontemporal``) writes whole
lines through write-combining buffers to memory instead.

:func:`plan` chooses, per phase, the ``for.vector`` loops whose vector steps
store this way: a loop that stores to a kernel argument at unit stride,
without a guard and once only in the loop's body, where no statement of
the phase loads that argument (so
nothing the phase reads is evicted and no later read of the phase depends
on the store reaching a cache). The code generator (``vector.py``) then
emits such a loop twice and picks at run time: the streaming form when the
argument holds at least :data:`MIN_BYTES` and the store's first address is a
multiple of the element size; it runs scalar iterations until the store's
address is aligned to the vector (the instructions need it), the vector
steps with aligned streaming stores, then the scalar rest. Otherwise the
ordinary loop runs. A phase body that may have streamed ends with a store
fence (``sfence``), so every streaming store is visible before the worker
reports the chunk done.

Meaning is unchanged: a streaming store writes the same bytes as an
ordinary one; only where the line travels differs, and the fence restores
the ordering the runtime's completion signal relies on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...lowering import loopir as L
from ...semantics import expr as E
from .prefetch import loads
from ...semantics.expr import stride

#: the least size in bytes of an argument whose stores stream: well above the
#: second-level cache of a core and the last-level cache share a core gets on
#: common x86 parts, so an output that streams would not have stayed cached
MIN_BYTES = 16 << 20


@dataclass(frozen=True)
class Stream:
    """The stores to ``buf`` in one loop may stream; the argument holds
    ``elements`` elements (an index expression over the kernel's symbols)."""

    buf: L.Buffer
    elements: E.Expr


def plan(k: L.Kernel, ph: L.Phase, may_alias: frozenset[str] = frozenset()
         ) -> dict[str, Stream]:
    """Loop-variable name -> the argument whose stores in that
    ``for.vector`` loop may stream (see the module docstring). An argument
    in ``may_alias`` (a call passed memory it shares with another) never
    streams: the phase may read it under the other name."""
    arguments = {b.name: b for b in k.globals
                 if b.space == "global" and b.arg >= 0 and b.name not in may_alias}
    loaded = {ld.buf.name for s in L.walk(ph.body) for ld in loads(s)}
    out: dict[str, Stream] = {}
    for s in L.walk(ph.body):
        if not (isinstance(s, L.For) and s.kind == "vector" and not s.reverse):
            continue
        x = E.Var(s.var.name)
        stores = [st for st in s.body if isinstance(st, L.Store)]
        for st in stores:
            if (st.guard is None and not st.mode and isinstance(st.index, L.IExpr)
                    and st.buf.name in arguments and st.buf.name not in loaded
                    and stride(st.index.e, x) == 1
                    and sum(o.buf.name == st.buf.name for o in stores) == 1):
                shape = k.params[arguments[st.buf.name].arg].shape
                size: E.Expr = E.Const(1)
                for d in shape:
                    size = E.mul(size, d)
                out[s.var.name] = Stream(st.buf, size)
                break
    return out
