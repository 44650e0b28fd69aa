"""What a compiled CUDA kernel uses: registers, spills, shared, stack, constant memory.

Two sources say it, and this module reads both:

* the ptxas verbose report that NVRTC appends to its program log when it is
  given ``--ptxas-options=-v`` (:func:`parse_ptxas_log`), the authoritative
  source: it alone knows spill traffic and names device functions;
* the cubin itself, an ELF file whose ``.nv.info`` attributes record the
  register count and stack frame of every kernel and whose per-kernel sections
  ``.nv.shared.<k>`` / ``.nv.constant0.<k>`` have the sizes of the kernel's
  static shared memory and parameter constant bank (:func:`elf_resources`).

:func:`kernel_resources` merges them: the ptxas figure wins where both exist,
the ELF fills what the report does not print (ptxas for ``sm_90`` and later
prints no ``cmem[0]`` figure, so the constant bank size comes from the ELF).

The ELF reader (:func:`read_cubin`) is deliberately small: little-endian ELF64
only (every cubin is), section headers, the symbol table and notes. The
meaning of the NVIDIA-specific parts is stated where they are decoded; it is
what current toolkits write, not a published specification, so every decoder
returns ``None`` rather than guessing when a layout does not match.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tilenest.errors import TilenestError
from tilenest.targets import CUDA

#: ``e_machine`` of an NVIDIA CUDA ELF (cubin).
EM_CUDA = 190

# .nv.info attribute codes (EIATTR_*) used here. Each entry of an info section
# is ``u8 format, u8 attribute`` followed by a payload: format 1 (no value)
# pads to 4 bytes, format 2 carries one byte (padded), format 3 one u16, and
# format 4 a u16 size and that many bytes.
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_REGCOUNT = 0x2F
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4

# In .nv.compat, attribute 9 is 1 exactly when the code was built for an
# architecture-specific target (sm_90a, sm_100a), 0 otherwise (sm_90, sm_100f).
_COMPAT_ARCH_SPECIFIC = 9

#: Shared memory at the start of every kernel's shared section that the system
#: reserves on sm_90 and later (cudaDevAttrReservedSharedMemoryPerBlock).
RESERVED_SHARED_BYTES = CUDA.profile.reserved_shared_bytes

# NVIDIA note types: the tool that produced the cubin, and the CUDA target.
_NOTE_TKINFO = 2000
_NOTE_CUINFO = 1000


class CubinFormatError(TilenestError):
    """Bytes that were expected to be a cubin are not a readable CUDA ELF file."""

    kind = "cubin format error"


@dataclass(frozen=True)
class KernelResources:
    """The resources one compiled function uses, per thread or per block.

    ``registers`` per thread; ``spill_store_bytes`` / ``spill_load_bytes`` the
    local-memory traffic ptxas inserted because registers ran out (``None`` when
    only the ELF was read: the cubin does not record spills); ``shared_bytes``
    the static ``__shared__`` bytes per block (dynamic shared memory is a launch
    parameter and not included); ``stack_frame_bytes`` the per-thread local
    stack (local arrays indexed at run time live there even without spills);
    ``constant_bytes`` the size of the kernel's constant bank 0 (its parameters
    and the driver's area; not the module's ``__constant__`` data, which the
    driver's ``CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES`` counts); ``barriers`` the named barriers used. ``entry`` is
    false for a device function that ptxas compiled separately (noinline).
    ``source`` says which report the figures came from: ``"ptxas"``, ``"elf"``
    or ``"ptxas+elf"``.
    """

    name: str
    registers: int | None = None
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None
    shared_bytes: int | None = None
    stack_frame_bytes: int | None = None
    constant_bytes: int | None = None
    barriers: int | None = None
    entry: bool = True
    source: str = "ptxas"

    @property
    def spilled(self) -> bool:
        """True iff ptxas reported any spill store or spill load."""
        return bool(self.spill_store_bytes) or bool(self.spill_load_bytes)

    def spill_warning(self) -> str | None:
        """A one-line description of the spill, or None if there is none."""
        if not self.spilled:
            return None
        what = "kernel" if self.entry else "device function"
        regs = f" with {self.registers} registers" if self.registers is not None else ""
        return (f"{what} '{self.name}' spills registers to local memory{regs}: "
                f"{self.spill_store_bytes or 0} bytes of spill stores, "
                f"{self.spill_load_bytes or 0} bytes of spill loads per thread")


# --------------------------------------------------------------------------- ptxas report

_ENTRY = re.compile(r"ptxas\s+info\s*:\s*Compiling entry function '([^']+)'")
_PROPS = re.compile(r"ptxas\s+info\s*:\s*Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"ptxas\s+info\s*:\s*Used (\d+) registers(.*)")
_USED_ITEM = re.compile(r"(\d+) (barriers|bytes smem|bytes cmem\[(\d+)\])")


def parse_ptxas_log(log: str) -> dict[str, KernelResources]:
    """The functions a ptxas verbose report (``-v``) describes, by (mangled) name.

    The report is a sequence of blocks: ``Compiling entry function 'k'`` opens
    an entry, ``Function properties for f`` names the function the next
    ``N bytes stack frame, S bytes spill stores, L bytes spill loads`` line
    belongs to (entries and separately compiled device functions alike), and
    ``Used R registers, used B barriers, X bytes smem[, Y bytes cmem[0]]``
    closes the entry. A kernel without ``smem`` in that line uses no static
    shared memory. Lines of other kinds are ignored.
    """
    out: dict[str, KernelResources] = {}
    entries: set[str] = set()
    entry: str | None = None
    current: str | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            entries.add(entry)
            out.setdefault(entry, KernelResources(name=entry, entry=True))
            continue
        if m := _PROPS.search(line):
            current = m.group(1)
            out.setdefault(current, KernelResources(name=current, entry=current in entries))
            continue
        if current is not None and (m := _FRAME.search(line)):
            out[current] = replace(out[current], stack_frame_bytes=int(m.group(1)),
                                   spill_store_bytes=int(m.group(2)),
                                   spill_load_bytes=int(m.group(3)))
            continue
        if entry is not None and (m := _USED.search(line)):
            r = replace(out[entry], registers=int(m.group(1)), shared_bytes=0)
            for item in _USED_ITEM.finditer(m.group(2)):
                n = int(item.group(1))
                if item.group(2) == "barriers":
                    r = replace(r, barriers=n)
                elif item.group(2) == "bytes smem":
                    r = replace(r, shared_bytes=n)
                elif item.group(3) == "0":
                    r = replace(r, constant_bytes=n)
            out[entry] = r
    return out


# --------------------------------------------------------------------------- ELF reader


@dataclass(frozen=True)
class ElfSection:
    """One section header of the cubin, with its name resolved."""

    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int


@dataclass(frozen=True)
class ElfSymbol:
    """One symbol of ``.symtab``: name, kind (low nibble of st_info), section index."""

    name: str
    kind: int
    section: int


@dataclass(frozen=True)
class Cubin:
    """The parts of a cubin's ELF structure this backend reads.

    ``abi_version`` is ``e_ident[EI_ABIVERSION]`` (8 for CUDA 13 cubins), which
    decides how ``flags`` (``e_flags``) encode the target.
    """

    data: bytes
    machine: int
    os_abi: int
    abi_version: int
    flags: int
    sections: tuple[ElfSection, ...]
    symbols: tuple[ElfSymbol, ...]

    def section(self, name: str) -> ElfSection | None:
        """The first section called ``name``, or None."""
        return next((s for s in self.sections if s.name == name), None)

    def contents(self, sec: ElfSection) -> bytes:
        """The bytes of ``sec`` (empty for a NOBITS section such as shared memory)."""
        if sec.type == 8:  # SHT_NOBITS occupies no file space
            return b""
        return self.data[sec.offset:sec.offset + sec.size]


def _cstr(data: bytes, at: int) -> str:
    end = data.find(b"\0", at)
    return data[at:end if end >= 0 else len(data)].decode("utf-8", "replace")


def read_cubin(data: bytes) -> Cubin:
    """Parse the ELF64 little-endian structure of a cubin.

    Raises :class:`CubinFormatError` if ``data`` is not an ELF64 LE file for
    ``EM_CUDA`` or a header points outside it.
    """
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise CubinFormatError("not an ELF file", hint="expected the bytes of a cubin")
    if data[4] != 2 or data[5] != 1:
        raise CubinFormatError("not a little-endian ELF64 file",
                               hint="every cubin is ELF64 little-endian")
    machine, = struct.unpack_from("<H", data, 18)
    if machine != EM_CUDA:
        raise CubinFormatError(f"ELF machine {machine} is not EM_CUDA ({EM_CUDA})",
                               hint="expected a cubin produced for an NVIDIA GPU")
    flags, = struct.unpack_from("<I", data, 48)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    if shentsize < 64 or shoff + shnum * shentsize > len(data) or shstrndx >= max(shnum, 1):
        raise CubinFormatError("section header table lies outside the file",
                               hint="the cubin is truncated or corrupt")
    raw = []
    for i in range(shnum):
        (name, typ, _fl, _addr, off, size, link, info, _al, _es) = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        raw.append((name, typ, off, size, link, info))
    strtab_off, strtab_size = raw[shstrndx][2], raw[shstrndx][3]
    names = data[strtab_off:strtab_off + strtab_size]
    sections = tuple(ElfSection(_cstr(names, n), t, o, s, lk, inf)
                     for (n, t, o, s, lk, inf) in raw)
    symbols: list[ElfSymbol] = []
    for sec in sections:
        if sec.type != 2:  # SHT_SYMTAB
            continue
        strs = sections[sec.link]
        sym_names = data[strs.offset:strs.offset + strs.size]
        for at in range(sec.offset, sec.offset + sec.size - 23, 24):
            st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, at)
            symbols.append(ElfSymbol(_cstr(sym_names, st_name), st_info & 0xF, st_shndx))
    return Cubin(data, machine, data[7], data[8], flags, sections, tuple(symbols))


def _info_entries(blob: bytes):
    """Yield ``(attribute, payload)`` of an ``.nv.info``-style attribute list."""
    at = 0
    while at + 4 <= len(blob):
        fmt, attr = blob[at], blob[at + 1]
        if fmt == _EIFMT_SVAL:
            size, = struct.unpack_from("<H", blob, at + 2)
            yield attr, blob[at + 4:at + 4 + size]
            at += 4 + size
        elif fmt in (_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL):
            yield attr, blob[at + 2:at + 4]
            at += 4
        else:  # an unknown format: its length is unknown, so stop reading
            return


def _notes(cubin: Cubin):
    """Yield ``(owner, type, desc)`` of every note in the cubin's NOTE sections."""
    for sec in cubin.sections:
        if sec.type != 7:  # SHT_NOTE
            continue
        blob, at = cubin.contents(sec), 0
        while at + 12 <= len(blob):
            namesz, descsz, typ = struct.unpack_from("<III", blob, at)
            name_at = at + 12
            desc_at = name_at + ((namesz + 3) & ~3)
            owner = blob[name_at:name_at + namesz].rstrip(b"\0").decode("ascii", "replace")
            yield owner, typ, blob[desc_at:desc_at + descsz]
            at = desc_at + ((descsz + 3) & ~3)


@dataclass(frozen=True)
class ToolInfo:
    """The producer note (``.note.nv.tkinfo``): tool, its version line, its options.

    For a cubin from NVRTC the tool is ``ptxas`` and ``options`` are the ptxas
    options NVRTC chose, e.g. ``"-arch sm_90a -fmad false"``.
    """

    tool: str
    version: str
    options: str


def tool_info(data: bytes | Cubin) -> ToolInfo | None:
    """Decode the tool note: six u32 (format, reserved, then the offsets of the
    tool name, version, branch and option strings into the string area that
    follows them). None if the cubin has no such note or it does not fit."""
    cubin = data if isinstance(data, Cubin) else read_cubin(data)
    for owner, typ, desc in _notes(cubin):
        if owner != "NVIDIA Corp" or typ != _NOTE_TKINFO or len(desc) < 24:
            continue
        offs = struct.unpack_from("<6I", desc, 0)
        strings = desc[24:]
        if max(offs[2], offs[3], offs[5]) >= len(strings):
            return None
        return ToolInfo(_cstr(strings, offs[2]), _cstr(strings, offs[3]), _cstr(strings, offs[5]))
    return None


def cubin_arch(data: bytes | Cubin) -> str | None:
    """The real target of a cubin, e.g. ``"sm_90a"``; None if it cannot be told.

    ``e_flags`` holds the SM number: in the low byte for ELF ABI version < 8,
    in bits 8..15 from ABI version 8 (CUDA 13) on. The architecture-specific
    ``a`` suffix is bit 11 (0x800) in the old layout and bit 3 (0x8) in the new
    one; NVRTC 13.0 leaves that bit clear for sm_90a and records the suffix in
    ``.nv.compat`` attribute 9 instead, so either one marks it.
    """
    cubin = data if isinstance(data, Cubin) else read_cubin(data)
    if cubin.abi_version >= 8:
        sm, accel = (cubin.flags >> 8) & 0xFF, bool(cubin.flags & 0x8)
    else:
        sm, accel = cubin.flags & 0xFF, bool(cubin.flags & 0x800)
    if sm == 0:
        return None
    compat = cubin.section(".nv.compat")
    if compat is not None:
        for attr, payload in _info_entries(cubin.contents(compat)):
            if attr == _COMPAT_ARCH_SPECIFIC and payload[:1] == b"\x01":
                accel = True
    return f"sm_{sm}{'a' if accel else ''}"


def elf_resources(data: bytes | Cubin) -> dict[str, KernelResources]:
    """Kernel resources as far as the cubin records them, by kernel name.

    A kernel is a function symbol with its own ``.nv.info.<name>`` section.
    The global ``.nv.info`` section lists, per function symbol,
    ``EIATTR_REGCOUNT`` and ``EIATTR_FRAME_SIZE`` (payload: u32 symbol index,
    u32 value). ``constant_bytes`` is the size of ``.nv.constant0.<name>``.
    ``shared_bytes`` is the size of ``.nv.shared.<name>`` less the system's
    reserved area: when the cubin has a ``.nv.shared.reserved.0`` section
    (CUDA 13 writes one for sm_90 and later), each kernel's shared section
    starts with :data:`RESERVED_SHARED_BYTES` that ptxas does not count as the
    kernel's. Spills are not recorded in the ELF and stay None.
    """
    cubin = data if isinstance(data, Cubin) else read_cubin(data)
    names = {s.name for s in cubin.sections}
    kernels = {sym.name for sym in cubin.symbols
               if sym.kind == 2 and f".nv.info.{sym.name}" in names}  # STT_FUNC
    regs: dict[str, int] = {}
    frame: dict[str, int] = {}
    info = cubin.section(".nv.info")
    if info is not None:
        for attr, payload in _info_entries(cubin.contents(info)):
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(payload) >= 8:
                index, value = struct.unpack_from("<II", payload, 0)
                if index < len(cubin.symbols):
                    table = regs if attr == EIATTR_REGCOUNT else frame
                    table[cubin.symbols[index].name] = value
    reserved = RESERVED_SHARED_BYTES if ".nv.shared.reserved.0" in names else 0
    out = {}
    for k in sorted(kernels):
        shared = cubin.section(f".nv.shared.{k}")
        const = cubin.section(f".nv.constant0.{k}")
        out[k] = KernelResources(
            name=k, registers=regs.get(k), stack_frame_bytes=frame.get(k),
            shared_bytes=max(shared.size - reserved, 0) if shared is not None else 0,
            constant_bytes=const.size if const is not None else None,
            entry=True, source="elf")
    return out


def kernel_resources(log: str, cubin: bytes | None) -> dict[str, KernelResources]:
    """Every function the ptxas report or the cubin describes, by name.

    Figures from the ptxas report win; a field the report leaves out is taken
    from the ELF (the constant bank size on sm_90+). A kernel only the ELF
    knows (ptxas ran without ``-v``) has the ELF's figures alone.
    """
    report = parse_ptxas_log(log)
    elf = elf_resources(cubin) if cubin else {}
    out = dict(report)
    for name, e in elf.items():
        r = report.get(name)
        if r is None:
            out[name] = e
            continue
        if r.constant_bytes is None and e.constant_bytes is not None:
            out[name] = replace(r, constant_bytes=e.constant_bytes, source="ptxas+elf")
    return out


def resources_of(table: Mapping[str, KernelResources], entries_only: bool = True
                 ) -> dict[str, KernelResources]:
    """The entries of ``table`` (kernels), or all of it when ``entries_only`` is false."""
    return {k: v for k, v in table.items() if v.entry or not entries_only}
