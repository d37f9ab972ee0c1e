"""A small, bounded reader of the ELF shared objects a Python environment holds, without loading
them: the dynamic symbols (what a library exports and what it needs from others), the symbol
versions it needs (GLIBC_2.x, GLIBCXX_3.4.x, read from .dynstr), and the GPU code in its fat
binaries (the `.nv_fatbin` and `__nv_relfatbin` sections: each entry's kind, SASS or PTX, and its
SM). cuobjdump is not needed.

Only 64-bit little-endian files are read (x86_64 and aarch64 Linux). Every size read from a file
is checked against the file's own size and against a cap before anything is read or allocated;
a file that is not what its header says is `None` (not an ELF this reader understands), never an
exception. The fat binary layout (a 16-byte header per container, then entries of a header and a
payload each, `next = entry + header_size + padded_size`) is NVIDIA's, undocumented; it is read
as cuobjdump's users describe it, and only the fields named here are trusted.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

from envbuilder.limits import NotRegularFile, open_regular
from envbuilder.record import Record

ELF_MAGIC = b"\x7fELF"
FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
SHT_NOBITS = 8
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
PTX, SASS = 1, 2  # a fat binary entry's kind (0x10: another SASS form)

MAX_SECTIONS = 1 << 16
MAX_SYMBOL_BYTES = 256 << 20  # .dynsym + .dynstr of the largest libtorch_cpu.so are ~40 MiB
MAX_FATBIN_ENTRIES = 1 << 20  # libcublasLt has ~5,000; flash-attn's largest ~3,000
ANY = re.compile(rb"")
_VERSION_NAME = re.compile(rb"\b(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)\b")


def _int_struct(layout: str) -> struct.Struct:
    """A little-endian layout of integer fields and pad bytes only, so that `_ints` holds."""
    if not re.fullmatch(r"<(\d*[xBHIQ])+", layout):
        raise ValueError(f"not an integer-only layout: {layout}")
    return struct.Struct(layout)


_EHDR = _int_struct("<16xHHIQQQIHHHHHH")  # (e_ident, checked byte by byte, is skipped)
_SHDR = _int_struct("<IIQQQQIIQQ")
_SYM = _int_struct("<IBBHQQ")
_FATBIN = _int_struct("<IHHQ")
_ENTRY = _int_struct("<HHIQIIII")  # kind, -, header size, padded payload size, size, -, -, sm


def _ints(layout: struct.Struct, data: bytes, offset: int = 0) -> tuple[int, ...]:
    """The fields of `layout` (an `_int_struct`: every one an int) at `offset` of `data`."""
    return cast("tuple[int, ...]", layout.unpack_from(data, offset))


def _each_ints(layout: struct.Struct, data: bytes) -> Iterator[tuple[int, ...]]:
    """`_ints` of each whole `layout` in `data` (whose length is a multiple of its size)."""
    return cast("Iterator[tuple[int, ...]]", layout.iter_unpack(data))


class GpuCode(Record):
    """One entry of a fat binary: SASS (`sm_XY`, runs on that major with minor >= Y) or PTX
    (`compute_XY`, compiled by the driver on a card of CC >= X.Y)."""

    kind: str  # "sass" or "ptx"
    cc: str  # "8.0"

    def label(self) -> str:
        return ("sm_" if self.kind == "sass" else "compute_") + self.cc.replace(".", "")


class Elf(Record):
    """What diagnose reads of one shared object."""

    undefined: frozenset[str]  # global symbols it needs from another library
    defined: frozenset[str]  # global and weak symbols it exports
    versions: tuple[str, ...]  # the symbol versions named in .dynstr: ("GLIBCXX_3.4.30", ...)
    gpu: tuple[GpuCode, ...]  # its fat binaries' entries, each (kind, cc) once
    has_fatbin: bool  # a .nv_fatbin / __nv_relfatbin section is there (its entries may be 0)


class _Section(Record):
    name: str
    kind: int
    offset: int
    size: int
    link: int
    entsize: int


def is_elf(path: Path) -> bool:
    """The file starts with ELF's magic (a regular file; links are followed, as the loader does)."""
    try:
        with open_regular(path) as f:
            return f.read(4) == ELF_MAGIC
    except (OSError, NotRegularFile):
        return False


def read_elf(path: Path, symbols: re.Pattern[bytes] | None = ANY, gpu: bool = True) -> Elf | None:
    """The dynamic symbols and GPU code of `path`; None when it is not a 64-bit little-endian ELF
    this reader understands, or cannot be read. `symbols`: only the names it matches are kept
    (None skips the symbol tables); `gpu=False` skips the fat binaries."""
    try:
        with open_regular(path) as f:
            return _read(f, os.fstat(f.fileno()).st_size, symbols, gpu)
    except (OSError, NotRegularFile, struct.error, _Malformed):
        return None


class _Malformed(Exception):
    """A size or offset that points outside the file, or over a cap."""


def _bytes(f: BinaryIO, size: int, offset: int, length: int, cap: int) -> bytes:
    if offset < 0 or length < 0 or offset + length > size or length > cap:
        raise _Malformed(f"{length} bytes at {offset} of a {size}-byte file")
    f.seek(offset)
    data = f.read(length)
    if len(data) != length:
        raise _Malformed("short read")
    return data


def _read(f: BinaryIO, size: int, symbols: re.Pattern[bytes] | None, gpu: bool) -> Elf | None:
    head = f.read(_EHDR.size)
    if len(head) < _EHDR.size or head[:4] != ELF_MAGIC or head[4] != 2 or head[5] != 1:
        return None  # (not ELF, not 64-bit, not little-endian)
    *_, shoff, _flags, _eh, _ph, _phn, shentsize, shnum, shstrndx = _ints(_EHDR, head)
    if shnum == 0 or shnum > MAX_SECTIONS or shentsize != _SHDR.size or shstrndx >= shnum:
        return None
    table = _bytes(f, size, shoff, shnum * _SHDR.size, MAX_SECTIONS * _SHDR.size)
    raw = [_ints(_SHDR, table, i * _SHDR.size) for i in range(shnum)]
    names_at = raw[shstrndx]
    names = _bytes(f, size, names_at[4], names_at[5], MAX_SYMBOL_BYTES)
    sections = [
        _Section(_cstr(names, r[0]), r[1], r[4], 0 if r[1] == SHT_NOBITS else r[5], r[6], r[9]) for r in raw
    ]
    by_name = {s.name: s for s in sections}
    undefined: set[str] = set()
    defined: set[str] = set()
    versions: tuple[str, ...] = ()
    dynsym = by_name.get(".dynsym")
    if symbols is not None and dynsym is not None and dynsym.link < len(sections):
        strtab = sections[dynsym.link]
        strings = _bytes(f, size, strtab.offset, strtab.size, MAX_SYMBOL_BYTES)
        # (no wanted name in the strings: the table is not walked)
        table = (
            _bytes(f, size, dynsym.offset, dynsym.size, MAX_SYMBOL_BYTES) if symbols.search(strings) else b""
        )
        for name_at, info, _other, shndx, _value, _size in _each_ints(
            _SYM, table[_SYM.size : len(table) - len(table) % _SYM.size]
        ):
            bind = info >> 4
            if bind not in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE):
                continue
            end = strings.find(b"\0", name_at)
            sym = strings[name_at : end if end >= 0 else len(strings)]
            if not symbols.match(sym):
                continue
            name = sym.decode("utf-8", "replace")
            if shndx == SHN_UNDEF:
                if bind != STB_WEAK:  # (a weak reference may stay unresolved)
                    undefined.add(name)
            else:
                defined.add(name)
        versions = tuple(
            sorted({f"{m[1].decode()}_{m[2].decode()}" for m in _VERSION_NAME.finditer(strings)})
        )
    code: set[GpuCode] = set()
    fatbins = [by_name[n] for n in FATBIN_SECTIONS if n in by_name]
    if gpu:
        for section in fatbins:
            code |= _fatbin_entries(f, size, section)
    return Elf(
        frozenset(undefined),
        frozenset(defined),
        versions,
        tuple(sorted(code, key=lambda c: (c.kind, tuple(map(int, c.cc.split(".")))))),
        bool(fatbins),
    )


def _cstr(table: bytes, at: int) -> str:
    end = table.find(b"\0", at)
    return table[at : end if end >= 0 else len(table)].decode("utf-8", "replace")


def _fatbin_entries(f: BinaryIO, size: int, section: _Section) -> set[GpuCode]:
    """Each (kind, SM) of the containers in one fat binary section, walked by their headers
    (payloads are skipped, never read)."""
    out: set[GpuCode] = set()
    pos, end = section.offset, section.offset + section.size
    if end > size:
        raise _Malformed("fat binary section past the end of the file")
    seen = 0
    while pos + _FATBIN.size <= end:
        magic, _version, header, fat_size = _ints(_FATBIN, _bytes(f, size, pos, _FATBIN.size, _FATBIN.size))
        if magic != FATBIN_MAGIC:
            nxt = (pos + 8) & ~7  # (containers are padded to 8 bytes; anything else ends the walk)
            if nxt - pos > 8 or magic != 0:
                break
            pos = nxt
            continue
        if header < _FATBIN.size:  # (a container that does not move the walk on: a crafted one)
            raise _Malformed("a fat binary container header shorter than its own fields")
        entry, stop = pos + header, min(pos + header + fat_size, end)
        while entry + _ENTRY.size <= stop:
            seen += 1
            if seen > MAX_FATBIN_ENTRIES:
                raise _Malformed("too many fat binary entries")
            kind, _v, hsize, padded, _size, _a, _b, sm = _ints(
                _ENTRY, _bytes(f, size, entry, _ENTRY.size, _ENTRY.size)
            )
            if hsize < _ENTRY.size:
                break
            if kind in (PTX, SASS, 0x10) and 10 <= sm < 1000:
                out.add(GpuCode("ptx" if kind == PTX else "sass", f"{sm // 10}.{sm % 10}"))
            entry += hsize + padded
        pos = pos + header + fat_size
    return out


def fatbin_container(entries: list[tuple[str, int, bytes]]) -> bytes:
    """One fat binary container of (kind "sass"/"ptx", sm, payload) entries, in the layout read
    above: what tests put in a `.nv_fatbin` section (there is no nvcc here to make one)."""
    body = b""
    for kind, sm, payload in entries:
        padded = payload + b"\0" * (-len(payload) % 8)
        header = _ENTRY.pack(PTX if kind == "ptx" else SASS, 0x0101, 64, len(padded), len(payload), 0, 0, sm)
        body += header + b"\0" * (64 - len(header)) + padded
    return _FATBIN.pack(FATBIN_MAGIC, 1, _FATBIN.size, len(body)) + body
