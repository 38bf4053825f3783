"""The live GPU, if there is one, described in the words a record's provenance uses."""

from __future__ import annotations

import functools
import re
import subprocess


def slug(name: str) -> str:
    """Folder name for a device's results: 'NVIDIA H200' → 'h200', 'Tesla T4' → 'tesla-t4'."""
    s = re.sub(r"\bnvidia\b", "", name.lower())
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


@functools.cache
def gpu() -> dict | None:
    """The live CUDA device (index 0 or the current one), or None when PyTorch sees no GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(idx)
    return {
        "gpu": p.name,
        "slug": slug(p.name),
        "capability": f"{p.major}.{p.minor}",
        "arch": f"{p.major}{p.minor}",
        "sm_count": p.multi_processor_count,
        "memory_gib": round(p.total_memory / 2**30, 1),
        "l2_mib": round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
        "driver": _driver_version(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__.split("+")[0],
    }


def describe() -> str:
    """One line for a notebook's setup cell: which GPU is live, or that recorded results are shown."""
    g = gpu()
    if g is None:
        return "No CUDA GPU here: GPU measurements below are loaded from recorded results."
    return (f"Live on {g['gpu']} (sm_{g['arch']}, {g['sm_count']} SMs, {g['memory_gib']} GiB), "
            f"driver {g['driver']}, CUDA {g['cuda']}, torch {g['torch']}.")


# Per-SM limits by compute capability (CUDA programming guide, "compute capabilities" table): 32-bit
# registers, resident threads, resident blocks, shared memory usable by blocks (bytes).
SM_LIMITS = {
    "7.5": {"registers": 65536, "threads": 1024, "blocks": 16, "smem": 65536},
    "8.0": {"registers": 65536, "threads": 2048, "blocks": 32, "smem": 167936},
    "8.6": {"registers": 65536, "threads": 1536, "blocks": 16, "smem": 102400},
    "8.9": {"registers": 65536, "threads": 1536, "blocks": 24, "smem": 102400},
    "9.0": {"registers": 65536, "threads": 2048, "blocks": 32, "smem": 233472},
}


def resident_blocks(capability: str, threads: int, registers: int, smem_bytes: int) -> int:
    """How many blocks of a kernel fit on one SM at once, limited by registers, threads, blocks and
    shared memory (registers are allocated per warp in units of 256; each block reserves 1 KiB of
    shared memory on sm_80 and later)."""
    lim = SM_LIMITS[capability]
    warps = -(-threads // 32)
    regs_per_warp = -(-registers * 32 // 256) * 256
    by_regs = lim["registers"] // (regs_per_warp * warps) if registers else lim["blocks"]
    reserved = 1024 if float(capability) >= 8.0 else 0
    by_smem = lim["smem"] // (smem_bytes + reserved) if smem_bytes + reserved else lim["blocks"]
    return int(min(by_regs, lim["threads"] // threads, lim["blocks"], by_smem))
