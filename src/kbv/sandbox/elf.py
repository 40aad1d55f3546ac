"""Symbol tables of ELF files, read in Python (no binutils: a sandboxed child may have none).

What attribution needs from a shared object the candidate built or loaded: the names of the device
kernels it defines (`kernel_entries`), as the driver names them (mangled; the profiler demangles).
Three ways to find them, all from the file itself:

- nvcc's host stubs: for every `__global__` function nvcc emits a host function of the kernel's own
  name (mangled, or plain under `extern "C"`) and a stub `__device_stub__<mangled name without its
  leading _>`, or the stub's static locals where the stub was inlined. The stub names the kernel;
  the host function confirms it.
- device code embedded uncompressed (a cubin as bytes, or a fatbin nvcc did not compress): an ELF
  for `EM_CUDA` whose function symbols are the device's own names.
- PTX text embedded as a string: its `.entry` names.

Where a file holds device code (a `.nv_fatbin` section) but none of the three names a kernel (a
toolchain other than nvcc), every function symbol it defines is returned instead.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

_MAGIC = b"\x7fELF"
_EM_CUDA = 190
_SHT_SYMTAB, _SHT_DYNSYM = 2, 11
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_STUB = "__device_stub__"
_STUB_LENGTH = re.compile(r"(\d+)" + _STUB)  # the length prefix of the stub's identifier in a mangled name
_SOURCE_NAME = re.compile(r"Z(\d+)")
_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$%]*)")
_DEVICE_CODE_SECTIONS = (".nv_fatbin", "__nv_relfatbin")


@dataclass(frozen=True)
class Symbol:
    name: str
    function: bool  # STT_FUNC (or an indirect function)
    defined: bool  # in a section of this file, not imported from another


@dataclass(frozen=True)
class _Section:
    name: str
    kind: int
    offset: int
    size: int
    link: int


class _Elf:
    """The section headers of one ELF image (32 or 64 bits, either byte order)."""

    def __init__(self, data: bytes, base: int = 0) -> None:
        ident = data[base:base + 6]
        if ident[:4] != _MAGIC or len(data) - base < 52 or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ValueError("not an ELF file")
        self.data, self.base = data, base  # an image embedded in a larger file starts at `base`
        self.wide = ident[4] == 2
        self.order = "<" if ident[5] == 1 else ">"
        header = "16sHHIQQQIHHHHHH" if self.wide else "16sHHIIIIIHHHHHH"
        fields = self._unpack(header, 0)
        self.machine = fields[2]
        shoff, shentsize, shnum, shstrndx = fields[6], fields[11], fields[12], fields[13]
        entry = "IIQQQQIIQQ" if self.wide else "IIIIIIIIII"
        if shoff == 0:
            self.sections: list[_Section] = []
            return
        if shentsize < struct.calcsize(self.order + entry):
            raise ValueError("truncated ELF section headers")
        first = self._unpack(entry, shoff)
        shnum = shnum or first[5]  # more than 0xff00 sections: the count is in section 0's size
        shstrndx = first[6] if shstrndx == 0xFFFF else shstrndx
        raw = [self._unpack(entry, shoff + i * shentsize) for i in range(min(shnum, 1 << 20))]
        names = raw[shstrndx] if shstrndx < len(raw) else None
        self.sections = [_Section(self._string(names[4], names[5], r[0]) if names else "", r[1], r[4], r[5], r[6])
                         for r in raw]

    def _unpack(self, fmt: str, offset: int) -> tuple[int, ...]:
        try:
            return struct.unpack_from(self.order + fmt, self.data, self.base + offset)
        except struct.error as exc:
            raise ValueError(f"truncated ELF file: {exc}") from None

    def _string(self, table_offset: int, table_size: int, index: int) -> str:
        if index >= table_size:
            return ""
        start, stop = self.base + table_offset + index, self.base + table_offset + table_size
        end = self.data.find(b"\0", start, stop)
        return self.data[start:end if end >= 0 else stop].decode("utf-8", "replace")

    def symbols(self) -> list[Symbol]:
        """The full symbol table (.symtab) where there is one, else the dynamic one (.dynsym)."""
        tables = {s.kind: s for s in self.sections if s.kind in (_SHT_SYMTAB, _SHT_DYNSYM)}
        table = tables.get(_SHT_SYMTAB) or tables.get(_SHT_DYNSYM)
        if table is None or table.link >= len(self.sections):
            return []
        strings = self.sections[table.link]
        fmt, size = ("IBBHQQ", 24) if self.wide else ("IIIBBH", 16)
        start = self.base + table.offset + size  # entry 0 is null
        raw = self.data[start:start + (table.size // size - 1) * size]
        if table.size >= size and len(raw) != (table.size // size - 1) * size:
            raise ValueError("truncated ELF symbol table")
        out = []
        for fields in struct.iter_unpack(self.order + fmt, raw):
            name, info, shndx = (fields[0], fields[1], fields[3]) if self.wide else (fields[0], fields[3], fields[5])
            if name:
                function = info & 0xF in (_STT_FUNC, _STT_GNU_IFUNC)
                out.append(Symbol(self._string(strings.offset, strings.size, name), function, shndx != 0))
        return out


def read_symbols(data: bytes) -> list[Symbol]:
    """The symbols of the ELF image `data`: .symtab where present (local symbols too), else .dynsym.
    Raises ValueError when `data` is not an ELF image or is truncated."""
    return _Elf(data).symbols()


def kernel_entries(data: bytes) -> set[str]:
    """Names of the device kernels the ELF image `data` (a host shared object) defines, as the driver
    names them: mangled C++ names, or plain ones (`extern "C"`, PTX entries). Raises ValueError when
    `data` is not an ELF image."""
    elf = _Elf(data)
    symbols = elf.symbols()
    defined = {s.name for s in symbols if s.defined and s.function}
    names = {k for s in symbols if _STUB in s.name for k in _stub_kernels(s.name, defined)}
    names |= _embedded_device_functions(data)
    names |= {m.decode("ascii", "replace") for m in _PTX_ENTRY.findall(data)}
    if not names and any(s.name in _DEVICE_CODE_SECTIONS for s in elf.sections):
        return defined  # device code that no stub names: a toolchain other than nvcc
    return names


def _stub_kernels(name: str, defined: set[str]) -> set[str]:
    """The kernels named by nvcc's stub identifiers inside the mangled symbol `name` (the stub itself
    or one of its static locals), confirmed by the kernel's host function among `defined`. The
    identifier `__device_stub__<tail>` is length-prefixed; digits of the preceding token may run into
    the prefix, so every split of the digits is tried."""
    out = set()
    for m in _STUB_LENGTH.finditer(name):
        digits, start = m.group(1), m.start(0) + len(m.group(1))
        for i in range(len(digits)):
            tail = name[start + len(_STUB):start + int(digits[i:])]
            if not tail:
                continue
            # C++ linkage: the kernel's mangled name is the tail's (its host function's has an L
            # after the _Z where the kernel is `static`)
            if "_" + tail in defined or (tail[:1] == "Z" and "_ZL" + tail[1:] in defined):
                out.add("_" + tail)
            source = _SOURCE_NAME.match(tail)  # Z<length><name>: the kernel's name in the source
            plain = tail[source.end():source.end() + int(source.group(1))] if source else ""
            if plain and plain in defined:  # extern "C": the kernel is named as in the source
                out.add(plain)
    return out


def _embedded_device_functions(data: bytes) -> set[str]:
    """Function symbols of every device ELF (cubin) stored uncompressed inside `data`."""
    out: set[str] = set()
    at = data.find(_MAGIC, 1)
    while at >= 0:
        try:
            inner = _Elf(data, at)
            if inner.machine == _EM_CUDA:
                out |= {s.name for s in inner.symbols() if s.defined and s.function}
        except ValueError:  # the magic bytes by chance, or a truncated image
            pass
        at = data.find(_MAGIC, at + 1)
    return out
