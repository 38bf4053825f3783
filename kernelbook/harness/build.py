"""Compile a chapter's kernels with load_inline, show their source, and report their resources.

A kernel named ``k`` is two files: ``kernels/k.cu`` (kernels and ``launch_*`` functions, plain CUDA)
and ``kernels/k.cpp`` (the torch binding). Headers they include with ``#include "x.cuh"`` from
``kernels/`` are part of the kernel too: they change its hash and its module name.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType

from .paths import KERNELS, RESULTS, ROOT, cache_dir

NVCC_FLAGS = ("-O3", "-lineinfo")  # no --use_fast_math: see the method chapter
CXX_FLAGS = ("-O3",)  # torch adds the C++ standard it was built with
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
_LIBRARY_INCLUDE = re.compile(r"^\s*#\s*include\s+<(?:cutlass|cute)/", re.MULTILINE)
# Kernels with a Hopper-only path (wgmma, setmaxnreg) guard it with this macro, which nvcc defines only for the
# arch-specific target sm_90a; such kernels are built for sm_90a on an sm_90 GPU.
_SM90A_FEATURE = "__CUDA_ARCH_FEAT_SM90_ALL"


def sources(name: str, root: Path | None = None) -> list[Path]:
    """The files kernel ``name`` is built from: its .cu, its .cpp, and the local headers they include."""
    root = root or KERNELS
    cu, cpp = root / f"{name}.cu", root / f"{name}.cpp"
    for p in (cu, cpp):
        if not p.is_file():
            raise FileNotFoundError(f"kernel {name!r}: {p} does not exist (a kernel is kernels/{name}.cu + .cpp)")
    found: list[Path] = [cu, cpp]
    todo = [cu, cpp]
    while todo:
        for inc in _INCLUDE.findall(todo.pop().read_text()):
            h = root / inc
            if h.is_file() and h not in found:
                found.append(h)
                todo.append(h)
    return found


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_hashes(name: str, root: Path | None = None) -> dict[str, str]:
    """{path relative to the repo: sha256} for every file of kernel ``name`` (what records store)."""
    out = {}
    for p in sources(name, root):
        try:
            key = p.resolve().relative_to(ROOT).as_posix()
        except ValueError:  # a kernels folder outside the repo (tests use temporary copies)
            key = f"kernels/{p.name}"
        out[key] = file_sha256(p)
    return out


def uses_cutlass(name: str) -> bool:
    """Whether kernel ``name`` includes CUTLASS's or CuTe's headers (``#include <cutlass/...>``)."""
    return any(_LIBRARY_INCLUDE.search(p.read_text()) for p in sources(name))


@cache
def cutlass_include() -> tuple[str, str]:
    """(include folder, version) of CUTLASS's and CuTe's headers, from the ``nvidia-cutlass`` package."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    folder = Path(spec.origin).parent / "source" / "include" if spec and spec.origin else None
    if folder is None or not (folder / "cutlass" / "cutlass.h").is_file():
        raise RuntimeError("this kernel is built from CUTLASS's headers, which come with the nvidia-cutlass package: "
                           "pip install nvidia-cutlass (or pip install -r requirements.txt)")
    return str(folder), importlib.metadata.version("nvidia-cutlass")


def include_paths(name: str) -> list[str]:
    """The folders nvcc searches for kernel ``name``'s headers: kernels/, and CUTLASS's where it uses them."""
    return [str(KERNELS), *([cutlass_include()[0]] if uses_cutlass(name) else [])]


def _include_flags(name: str) -> list[str]:
    return [f for d in include_paths(name) for f in ("-I", d)]


def uses_sm90a(name: str) -> bool:
    """Whether kernel ``name`` has code for sm_90a alone (it tests ``__CUDA_ARCH_FEAT_SM90_ALL``)."""
    return any(_SM90A_FEATURE in p.read_text() for p in sources(name))


def target(name: str, arch: str) -> str:
    """The target nvcc builds kernel ``name`` for on a GPU of ``arch``: '90a' for Hopper-only code on sm_90."""
    return "90a" if arch == "90" and uses_sm90a(name) else arch


def _arch_flags(arch: str, name: str | None = None) -> list[str]:
    t = target(name, arch) if name else arch
    return [f"-gencode=arch=compute_{t},code=sm_{t}"]


def _define_flags(defines: Mapping[str, int | str] | None) -> list[str]:
    return [f"-D{k}={v}" for k, v in sorted((defines or {}).items())]


def module_name(name: str, arch: str, defines: Mapping[str, int | str] | None = None) -> str:
    """A name unique to these sources, flags and architecture: load_inline never mixes two builds."""
    h = hashlib.sha256()
    for p in sources(name):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(" ".join((*NVCC_FLAGS, *_define_flags(defines), *CXX_FLAGS, target(name, arch))).encode())
    if uses_cutlass(name):  # a new CUTLASS is a new build
        h.update(b"cutlass " + cutlass_include()[1].encode())
    return f"kb_{name}_{h.hexdigest()[:12]}_sm{arch}"


@cache
def cuda_home() -> str:
    """The CUDA toolkit's root, asked of nvcc itself (``nvcc`` on PATH may be a wrapper or a link)."""
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env:
        return env
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc is not on PATH: install the CUDA toolkit or set CUDA_HOME")
    dry = subprocess.run([nvcc, "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True, text=True).stderr
    m = re.search(r"^#\$ _HERE_=(.+)$", dry, re.MULTILINE)
    bindir = Path(m.group(1).strip()) if m else Path(os.path.realpath(nvcc)).parent
    return str(bindir.parent)


def live_arch() -> str:
    """Compute capability of the live GPU as nvcc writes it ('90' for sm_90)."""
    from .device import gpu

    g = gpu()
    if g is None:
        raise RuntimeError("no CUDA GPU is visible: pass arch= (e.g. '90') to compile without one")
    return g["arch"]


def plan(name: str, arch: str | None = None, defines: Mapping[str, int | str] | None = None) -> dict:
    """What load() will do for kernel ``name``: module name, build folder, flags (no compiling)."""
    arch = arch or live_arch()
    mod = module_name(name, arch, defines)
    return {
        "kernel": name,
        "module": mod,
        "sources": [p.relative_to(p.parents[1]).as_posix() for p in sources(name)],
        "build_dir": cache_dir() / mod,
        "nvcc_flags": [*NVCC_FLAGS, *_define_flags(defines), *_arch_flags(arch, name)],
        "cxx_flags": list(CXX_FLAGS),
    }


class Extension:
    """A compiled kernel's module as the book calls it: the capstones' fused ops come with their autograd
    (``autograd_ops.wrap``: differentiable, in any grad mode), every other op in any grad mode with a backward
    that refuses by name; ``raw`` is the module load_inline built, whose functions compute values only and
    return tensors outside autograd's graph."""

    def __init__(self, raw: ModuleType):
        self.raw = raw

    def __getattr__(self, op: str):
        attr = getattr(self.raw, op)
        if callable(attr):
            from ..models import autograd_ops

            attr = autograd_ops.wrap(op, self.raw)
        self.__dict__[op] = attr  # found once
        return attr

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self.raw)) | {"raw"})

    def __repr__(self) -> str:
        return f"<kernelbook extension {self.raw.__name__}>"


_loaded: dict[str, Extension] = {}


def load(name: str, arch: str | None = None, verbose: bool = False,
         defines: Mapping[str, int | str] | None = None) -> Extension:
    """Compile (or reuse) kernel ``name`` for ``arch`` (default: the live GPU) and import it.

    ``defines`` become ``-DNAME=value`` for nvcc: compile-time parameters a chapter explores (tile sizes).
    """
    p = plan(name, arch, defines)
    if p["module"] in _loaded:
        return _loaded[p["module"]]
    home = cuda_home()
    os.environ.setdefault("CUDA_HOME", home)
    import torch.utils.cpp_extension as cpp_ext

    cpp_ext.CUDA_HOME = home  # torch guessed it at import from the nvcc on PATH, which may be a wrapper
    p["build_dir"].mkdir(parents=True, exist_ok=True)
    mod = cpp_ext.load_inline(
        name=p["module"],
        cpp_sources=[(KERNELS / f"{name}.cpp").read_text()],
        cuda_sources=[(KERNELS / f"{name}.cu").read_text()],
        extra_cflags=p["cxx_flags"],
        extra_cuda_cflags=p["nvcc_flags"],
        extra_include_paths=include_paths(name),
        build_directory=str(p["build_dir"]),
        no_implicit_headers=True,  # the .cu is torch-free; the .cpp includes what it needs
        verbose=verbose,
    )
    _loaded[p["module"]] = Extension(mod)
    return _loaded[p["module"]]


def show_source(name: str, which: Sequence[str] = ("cu", "cpp")):
    """The kernel's files as highlighted code blocks, for a notebook cell's output."""
    from IPython.display import Markdown

    lang = {"cu": "cuda", "cpp": "cpp", "cuh": "cuda"}
    parts = []
    for p in sources(name):
        ext = p.suffix.lstrip(".")
        if ext in which or (ext == "cuh" and "cu" in which):
            parts.append(f"**`kernels/{p.name}`**\n\n```{lang[ext]}\n{p.read_text().rstrip()}\n```\n")
    return Markdown("\n".join(parts))


_FUNC = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def _demangle(names: list[str]) -> list[str]:
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None and shutil.which("nvcc"):
        cand = Path(cuda_home()) / "bin" / "cu++filt"
        tool = str(cand) if cand.exists() else None
    if tool is None or not names:
        return names
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return out if len(out) == len(names) else names


def short_name(demangled: str) -> str:
    """'void (anonymous namespace)::k<(int)4, (bool)1>(Params)' → 'k<4, 1>'.

    c++filt writes template arguments as ``4, true``; cu++filt as ``(int)4, (bool)1`` and the anonymous
    namespace as ``<unnamed>``. The parameter list is the first '(' outside the template brackets.
    """
    s = demangled.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    s = re.sub(r"\((?:int|unsigned int|long|bool|unsigned)\)", "", s).replace("true", "1").replace("false", "0")
    depth = 0
    for i, ch in enumerate(s):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            s = s[:i]
            break
    return s.strip().removeprefix("void ").strip()


def parse_resource_usage(text: str) -> list[dict]:
    """Rows of (kernel, registers, smem, stack, spills) from ``nvcc --resource-usage`` output."""
    rows: list[dict] = []
    current: dict | None = None
    for line in text.splitlines():
        if m := _FUNC.search(line):
            current = {"mangled": m.group(1)}
            rows.append(current)
        elif current is not None and (m := _FRAME.search(line)):
            current["stack_bytes"] = int(m.group(1))
            current["spill_store_bytes"] = int(m.group(2))
            current["spill_load_bytes"] = int(m.group(3))
        elif current is not None and (m := _USED.search(line)):
            current["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            current["smem_bytes"] = int(s.group(1)) if s else 0
    for r, d in zip(rows, _demangle([r["mangled"] for r in rows]), strict=True):
        r["kernel"] = short_name(d)
    return rows


def resources(name: str, arch: str = "90", defines: Mapping[str, int | str] | None = None) -> list[dict]:
    """Registers, static shared memory, stack frame and spills of each kernel in kernels/<name>.cu.

    Compiles only the torch-free .cu with nvcc (with ``defines``, as ``load`` would), so it works on
    any machine with the CUDA toolkit. Without one, the report recorded by a run that had it is
    returned (``results/compiler/<name>.json``), under a note that says so.
    """
    return _compiler_report(name, f"resources sm_{arch} {_define_key(defines)}",
                            lambda: _resources_live(name, arch, defines))


def _resources_live(name: str, arch: str, defines: Mapping[str, int | str] | None) -> list[dict]:
    nvcc = shutil.which("nvcc") or str(Path(cuda_home()) / "bin" / "nvcc")
    cu = KERNELS / f"{name}.cu"
    cmd = [nvcc, "--resource-usage", *NVCC_FLAGS, *_define_flags(defines), *_arch_flags(arch, name),
           *_include_flags(name),
           "-c", str(cu), "-o", os.devnull]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed on {cu.name} for sm_{arch}:\n{res.stderr}")
    rows = parse_resource_usage(res.stdout + res.stderr)
    keys = ("kernel", "registers", "smem_bytes", "stack_bytes", "spill_store_bytes", "spill_load_bytes")
    return [{"arch": f"sm_{target(name, arch)}", **{k: r.get(k) for k in keys}} for r in rows]


def ptx_instructions(name: str, kernel: str, arch: str = "90") -> list[str]:
    """The PTX instructions (opcodes) of the kernel in kernels/<name>.cu whose mangled name contains
    ``kernel``, as nvcc emits them with the book's flags: enough to count FMAs without a GPU. Without
    the CUDA toolkit, the list recorded by a run that had it."""
    return _compiler_report(name, f"ptx {kernel} sm_{arch}", lambda: _ptx_live(name, kernel, arch))


def _entry_body(ptx: str, kernel: str) -> str:
    """The body of the first .entry whose name contains ``kernel``, up to its matching brace (inline asm
    opens blocks of its own)."""
    m = next(m for m in re.finditer(r"\.entry\s+(\S+)\(", ptx) if kernel in m.group(1))
    start = ptx.index("{", ptx.index(")", m.end()))
    depth = 0
    for i in range(start, len(ptx)):
        depth += {"{": 1, "}": -1}.get(ptx[i], 0)
        if depth == 0:
            return ptx[start + 1:i]
    raise ValueError(f"unbalanced braces in the PTX of {m.group(1)}")


def _ptx_live(name: str, kernel: str, arch: str) -> list[str]:
    import tempfile

    nvcc = shutil.which("nvcc") or str(Path(cuda_home()) / "bin" / "nvcc")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{name}.ptx"
        subprocess.run([nvcc, *NVCC_FLAGS, *_arch_flags(arch, name), *_include_flags(name), "-ptx",
                        str(KERNELS / f"{name}.cu"), "-o", str(out)], check=True, capture_output=True, text=True)
        text = out.read_text()
    body = _entry_body(text, kernel)
    ops = []
    for line in body.splitlines():
        line = line.strip()
        if not line or line.startswith(("//", ".", "{", "}", "$", ")")) or line.endswith(":"):
            continue
        line = re.sub(r"^@!?%\w+\s+", "", line)  # predicate guard
        ops.append(line.split()[0].rstrip(";"))
    return ops


# ------------------------------------------------------------------------------ recorded compiler reports
# The compiler's reports (resource usage, PTX) need nvcc, which a machine that only builds the book may
# lack. A run that has nvcc and KERNELBOOK_RECORD=1 (or KERNELBOOK_RECORD_COMPILER=1) stores each report
# it computes in results/compiler/<kernel>.json with the kernel sources' hashes; a run without nvcc
# shows the stored report under a note. A test fails when a kernel changed after its report was stored.

COMPILER_RESULTS = RESULTS / "compiler"
_noted: set[str] = set()


def have_nvcc() -> bool:
    """True when the CUDA toolkit's compiler can be found (on PATH or under $CUDA_HOME)."""
    if shutil.which("nvcc"):
        return True
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    return bool(home) and (Path(home) / "bin" / "nvcc").is_file()


def _define_key(defines: Mapping[str, int | str] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((defines or {}).items()))


def compiler_record_path(name: str) -> Path:
    return COMPILER_RESULTS / f"{name}.json"


def _nvcc_version() -> str:
    out = subprocess.run([shutil.which("nvcc") or str(Path(cuda_home()) / "bin" / "nvcc"), "--version"],
                         capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+)", out)
    return m.group(1) if m else "unknown"


def _compiler_report(name: str, key: str, compute):
    import json

    path = compiler_record_path(name)
    if have_nvcc():
        value = compute()
        if os.environ.get("KERNELBOOK_RECORD") == "1" or os.environ.get("KERNELBOOK_RECORD_COMPILER") == "1":
            import datetime as dt

            hashes = source_hashes(name)
            rec = json.loads(path.read_text()) if path.is_file() else {}
            if rec.get("provenance", {}).get("kernels") != hashes:
                rec = {"kernel": name, "reports": {}}
            rec["provenance"] = {"nvcc": _nvcc_version(), "kernels": hashes,
                                 "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
            rec["reports"][key] = value
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        return value
    if not path.is_file():
        raise RuntimeError(f"no CUDA toolkit (nvcc) here and no recorded compiler report for kernels/{name}.cu: "
                           f"run the chapter once where nvcc is installed with KERNELBOOK_RECORD_COMPILER=1")
    rec = json.loads(path.read_text())
    if key not in rec["reports"]:
        raise RuntimeError(f"no CUDA toolkit (nvcc) here, and the recorded compiler reports for kernels/{name}.cu "
                           f"lack {key!r}: re-record them where nvcc is installed (KERNELBOOK_RECORD_COMPILER=1)")
    if name not in _noted:
        _noted.add(name)
        _show_note(name, rec["provenance"])
    return rec["reports"][key]


def _show_note(name: str, prov: dict) -> None:
    import html

    text = (f"No CUDA toolkit in this build: the compiler's reports for kernels/{name}.cu below were "
            f"recorded with nvcc {prov['nvcc']} on {prov['date']} from the same sources (their hashes match).")
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display

        if get_ipython() is not None:
            display(HTML('<div class="admonition note"><p class="admonition-title">Recorded compiler report</p>'
                         f"<p>{html.escape(text)}</p></div>"))
            return
    except ImportError:
        pass
    print(text)
