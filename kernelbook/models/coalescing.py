"""A model of global-memory coalescing: which 32-byte sectors and 128-byte lines each warp-level request touches.

A *mapping* says which element each thread of a launch accesses. Threads form warps the way the
hardware forms them: threadIdx linearised x-fastest within a block, 32 consecutive threads per warp,
the last warp of a block partial when the block size is not a multiple of 32. Each memory instruction
a warp executes is one *request* to the L1/TEX unit (Volta and newer: one request per warp-wide
instruction, whatever the access width); the request needs every distinct 32-byte sector its active
lanes' bytes fall in. Those are the quantities Nsight Compute counts as ``l1tex__t_requests_*`` and
``l1tex__t_sectors_*`` (``NCU_METRICS``). Everything is vectorised with numpy over (warps, 32 lanes)
arrays; launches too large to enumerate in a moment are analysed on a seeded random sample of whole
blocks (``analyse(..., budget=...)``), and the result says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

WARP = 32          # threads per warp (not 128)
SECTOR = 32        # bytes per sector: the unit global memory is fetched in
LINE = 128         # bytes per cache line: 4 sectors
KINDS = ("ld", "st")
FLAT_THREADS = 256  # kFlatThreads in kernels/mappings.cu: 1-D blocks of the flat mappings
UNROLL = 4          # kUnroll in kernels/mappings.cu: independent accesses per thread in the unrolled mappings
PLANE_CHUNK = FLAT_THREADS * UNROLL * 4  # kPlaneChunk: floats of one plane per block of planes_vec4_x4
NCU_METRICS = {    # Nsight Compute's names for what the model predicts, per kind of access
    "ld": {"requests": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
           "sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"},
    "st": {"requests": "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
           "sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"},
}


# Each mapping's kernel in kernels/mappings.cu, as the compiler's report and the profiler name it.
KERNELS = {"flat": "flat_kernel", "flat_vec4": "flat_vec4_kernel", "channel_fastest": "channel_fastest_kernel",
           "pixel_loop": "pixel_loop_kernel", "tile_7x18x4": "tile_kernel<18, 7, 4>",
           "tile_8x8x8": "tile_kernel<8, 8, 8>", "rows_w_x4": "rows_kernel",
           "channel_fastest_smem": "channel_fastest_smem_kernel", "flat_x4": "flat_x4_kernel",
           "flat_vec4_x4": "flat_vec4_x4_kernel", "planes_vec4_x4": "planes_vec4_x4_kernel",
           "flat_vec4_x4_i32": "flat_vec4_x4_i32_kernel"}
# Bytes of x one thread has requested before its first store, by the kernel's source (and its PTX): the
# bytes it can have in flight. pixel_loop's 64 loads are independent, but how many the compiler issues
# before the first store is its scheduler's choice, so it is not stated here.
LOADED_AHEAD = {"flat": 4, "flat_vec4": 16, "channel_fastest": 4, "pixel_loop": float("nan"),
                "tile_7x18x4": 4, "tile_8x8x8": 4, "rows_w_x4": 4, "channel_fastest_smem": 4,
                "flat_x4": 4 * UNROLL, "flat_vec4_x4": 16 * UNROLL, "planes_vec4_x4": 16 * UNROLL,
                "flat_vec4_x4_i32": 16 * UNROLL}

# Why warps wait (Nsight Compute, sm_70 and newer): warps stalled for each reason per issued instruction.
STALL_REASONS = ("long_scoreboard", "lg_throttle", "mio_throttle", "short_scoreboard", "imc_miss",
                 "barrier", "wait", "not_selected", "selected")
NCU_STALLS = {r: f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS}
# How busy the schedulers are: warp instructions executed (each takes one issue slot of its sub-partition's
# scheduler, one per cycle), and the share of active cycles in which a scheduler issued one.
NCU_ISSUE = {"warp instructions": "smsp__inst_executed.sum",
             "issue slots busy %": "smsp__issue_active.avg.pct_of_peak_sustained_active"}
ISSUE_PER_CLOCK = 4  # sub-partitions (schedulers) per SM since Volta, each issuing one warp instruction a cycle


def _dim3(v: int | Sequence[int]) -> tuple[int, int, int]:
    t = (int(v), 1, 1) if np.isscalar(v) else tuple(int(d) for d in v) + (1,) * (3 - len(v))
    if len(t) != 3 or min(t) < 1:
        raise ValueError(f"a launch dimension needs 1 to 3 positive sizes, got {v!r}")
    return t  # type: ignore[return-value]


@dataclass(frozen=True)
class Launch:
    """A kernel launch's shape: grid and block sizes in x, y, z."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    def __init__(self, grid: int | Sequence[int], block: int | Sequence[int]):
        object.__setattr__(self, "grid", _dim3(grid))
        object.__setattr__(self, "block", _dim3(block))
        if self.threads_per_block > 1024:
            raise ValueError(f"a block holds at most 1024 threads, got {self.block} = {self.threads_per_block}")

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def warps_per_block(self) -> int:
        return -(-self.threads_per_block // WARP)

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def warps(self) -> int:
        return self.blocks * self.warps_per_block

    @property
    def threads(self) -> int:
        return self.blocks * self.threads_per_block


@dataclass
class Threads:
    """Index arrays of shape (warps, 32) for the lane slots of some blocks of a launch.

    ``exists`` is False for the slots past a block's last thread (the idle lanes of a partial warp);
    ``gid`` is the flat global thread id (linear block index × threads per block + linear thread index).
    """

    launch: Launch
    block_id: np.ndarray
    bx: np.ndarray
    by: np.ndarray
    bz: np.ndarray
    tx: np.ndarray
    ty: np.ndarray
    tz: np.ndarray
    tid: np.ndarray
    warp: np.ndarray
    exists: np.ndarray

    @property
    def gid(self) -> np.ndarray:
        return self.block_id * self.launch.threads_per_block + self.tid


def threads(launch: Launch, blocks: Iterable[int] | np.ndarray | None = None) -> Threads:
    """The lane slots of ``blocks`` (linear block ids, x fastest; default: every block), warp by warp."""
    b = np.arange(launch.blocks, dtype=np.int64) if blocks is None else np.asarray(blocks, dtype=np.int64)
    wpb, tpb = launch.warps_per_block, launch.threads_per_block
    slot = np.arange(wpb * WARP, dtype=np.int64)
    bid = np.repeat(b, wpb * WARP).reshape(-1, WARP)
    tid = np.tile(slot, len(b)).reshape(-1, WARP)
    gx, gy, _ = launch.grid
    bx_, by_, _ = launch.block
    return Threads(launch=launch, block_id=bid, bx=bid % gx, by=(bid // gx) % gy, bz=bid // (gx * gy),
                   tx=tid % bx_, ty=(tid // bx_) % by_, tz=tid // (bx_ * by_), tid=tid, warp=tid // WARP,
                   exists=tid < tpb)


@dataclass
class Access:
    """One memory instruction of the kernel, as the element index each lane accesses.

    ``index`` counts elements of ``elem_bytes`` bytes (16 for a float4) from a tensor whose element 0 sits
    at byte address ``base`` (only ``base`` modulo 128 matters); ``active`` masks lanes that skip it.
    """

    name: str
    kind: str
    index: np.ndarray
    active: np.ndarray | None = None
    elem_bytes: int = 4
    base: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"access {self.name!r}: kind must be 'ld' or 'st', got {self.kind!r}")


Mapping = Callable[[Threads], Iterable[Access]]


def _distinct_per_row(keys: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """How many distinct values each row of ``keys`` holds among its ``valid`` entries."""
    big = np.iinfo(np.int64).max
    k = np.sort(np.where(valid, keys, big), axis=1)
    new = np.empty(k.shape, dtype=bool)
    new[:, 0] = True
    new[:, 1:] = k[:, 1:] != k[:, :-1]
    return (new & (k != big)).sum(axis=1)


def request_stats(addr: np.ndarray, active: np.ndarray, elem_bytes: int) -> dict[str, np.ndarray]:
    """Per warp (row of ``addr``, byte addresses of 32 lanes): active lanes, distinct sectors and lines,
    bytes used (distinct elements × size) and bytes fetched (sectors × 32)."""
    if not 1 <= elem_bytes <= SECTOR:
        raise ValueError(f"an access is 1 to {SECTOR} bytes per lane (16 for a float4), got {elem_bytes}")
    addr = np.asarray(addr, dtype=np.int64)
    last = addr + (elem_bytes - 1)
    both = np.concatenate([addr, last], axis=1)   # an element may straddle a sector or line boundary
    ok2 = np.concatenate([active, active], axis=1)
    sectors = _distinct_per_row(both // SECTOR, ok2)
    lines = _distinct_per_row(both // LINE, ok2)
    used = _distinct_per_row(addr, active) * elem_bytes
    return {"lanes": active.sum(axis=1), "sectors": sectors, "lines": lines, "bytes_used": used,
            "bytes_fetched": sectors * SECTOR}


def warp_request(addresses: Sequence[int] | np.ndarray, elem_bytes: int = 4,
                 active: Sequence[bool] | np.ndarray | None = None) -> dict[str, int | float]:
    """One warp's request from its lanes' byte addresses (≤ 32): sectors, lines, bytes used and fetched."""
    a = np.asarray(addresses, dtype=np.int64).reshape(1, -1)
    if a.shape[1] > WARP:
        raise ValueError(f"a warp has {WARP} lanes, got {a.shape[1]} addresses")
    act = np.ones(a.shape, dtype=bool) if active is None else np.asarray(active, dtype=bool).reshape(1, -1)
    s = {k: int(v[0]) for k, v in request_stats(a, act, elem_bytes).items()}
    s["efficiency"] = s["bytes_used"] / s["bytes_fetched"] if s["bytes_fetched"] else float("nan")
    return s


_SUMS = ("requests", "lanes", "sectors", "lines", "bytes_used", "bytes_fetched")


@dataclass
class Analysis:
    """What a mapping's launch asks of the memory system, per access and in total.

    ``per_access`` has one row per memory instruction of the kernel (summed over the analysed warps and
    scaled by ``scale`` when only a sample of blocks was analysed); ``hist`` counts requests by sectors.
    """

    launch: Launch
    blocks_analysed: int
    per_access: dict[str, dict] = field(default_factory=dict)
    hist: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def sampled(self) -> bool:
        return self.blocks_analysed < self.launch.blocks

    @property
    def scale(self) -> float:
        return self.launch.blocks / self.blocks_analysed

    def table(self):
        """One row per access: requests, sectors, sectors per request, lines per request, efficiency."""
        import pandas as pd

        df = pd.DataFrame.from_dict(self.per_access, orient="index")
        for k in _SUMS:
            df[k] = df[k] * self.scale
        return _ratios(df)

    def totals(self):
        """Loads and stores summed over accesses, in the units Nsight Compute reports (see NCU_METRICS)."""
        df = self.table()
        return _ratios(df.groupby("kind")[list(_SUMS)].sum().reindex([k for k in KINDS if k in set(df["kind"])]))

    def summary(self) -> dict:
        """Flat numbers for a comparison table: requests, sectors, sectors/request per kind; efficiency."""
        t = self.totals()
        out: dict = {}
        for kind, row in t.iterrows():
            out[f"{kind}_requests"] = row["requests"]
            out[f"{kind}_sectors"] = row["sectors"]
            out[f"{kind}_sectors_per_request"] = row["sectors_per_request"]
        out["efficiency"] = t["bytes_used"].sum() / t["bytes_fetched"].sum()
        out["blocks_analysed"] = self.blocks_analysed
        out["sampled"] = self.sampled
        return out


def _ratios(df):
    df = df.copy()
    df["sectors_per_request"] = df["sectors"] / df["requests"]
    df["lines_per_request"] = df["lines"] / df["requests"]
    df["lanes_per_request"] = df["lanes"] / df["requests"]
    df["efficiency"] = df["bytes_used"] / df["bytes_fetched"]
    return df


def _accumulate(res: Analysis, t: Threads, mapping: Mapping) -> None:
    for acc in mapping(t):
        idx = np.broadcast_to(np.asarray(acc.index, dtype=np.int64), t.tid.shape)
        act = t.exists if acc.active is None else (t.exists & np.broadcast_to(acc.active, t.tid.shape))
        s = request_stats(acc.base + idx * acc.elem_bytes, act, acc.elem_bytes)
        issued = s["lanes"] > 0  # a warp whose lanes all skipped the instruction sends no request
        row = res.per_access.setdefault(acc.name, {"kind": acc.kind, "elem_bytes": acc.elem_bytes,
                                                   **dict.fromkeys(_SUMS, 0)})
        row["requests"] += int(issued.sum())
        for k in _SUMS[1:]:
            row[k] += int(s[k].sum())
        h = np.bincount(s["sectors"][issued], minlength=2 * WARP + 1)
        prev = res.hist.get(acc.name, np.zeros(0, dtype=np.int64))
        n = max(len(h), len(prev))
        res.hist[acc.name] = np.pad(h, (0, n - len(h))) + np.pad(prev, (0, n - len(prev)))


def analyse(mapping: Mapping, launch: Launch, budget: int | None = None, seed: int = 0,
            chunk_slots: int = 1 << 16) -> Analysis:
    """Every request of ``mapping`` over ``launch`` — or, with ``budget``, a seeded random sample of whole
    blocks holding about ``budget`` lane-accesses (lane slots × instructions), with totals scaled up.

    Blocks are processed in chunks of about ``chunk_slots`` lane slots, so memory stays bounded.
    """
    probe = threads(launch, [0])
    per_block = probe.tid.size * max(1, sum(1 for _ in mapping(probe)))
    blocks = np.arange(launch.blocks, dtype=np.int64)
    if budget is not None and launch.blocks * per_block > budget:
        k = max(1, budget // per_block)
        blocks = np.sort(np.random.default_rng(seed).choice(launch.blocks, size=k, replace=False))
    res = Analysis(launch=launch, blocks_analysed=len(blocks))
    step = max(1, chunk_slots // (launch.warps_per_block * WARP))
    for i in range(0, len(blocks), step):
        _accumulate(res, threads(launch, blocks[i:i + step]), mapping)
    return res


def requests(mapping: Mapping, launch: Launch, blocks: Iterable[int] = (0,)):
    """Every request of ``blocks`` (default: block 0), one row each: access, block, warp, lanes, sectors,
    lines, bytes used and fetched — for tables of a few warps, not for whole launches."""
    import pandas as pd

    t = threads(launch, list(blocks))
    rows = []
    for acc in mapping(t):
        idx = np.broadcast_to(np.asarray(acc.index, dtype=np.int64), t.tid.shape)
        act = t.exists if acc.active is None else (t.exists & np.broadcast_to(acc.active, t.tid.shape))
        s = request_stats(acc.base + idx * acc.elem_bytes, act, acc.elem_bytes)
        rows.append(pd.DataFrame({"access": acc.name, "kind": acc.kind, "block": t.block_id[:, 0],
                                  "warp": t.warp[:, 0], **s}))
    df = pd.concat(rows, ignore_index=True)
    return df[df["lanes"] > 0].reset_index(drop=True)


def composition(launch: Launch, coords: Callable[[Threads], dict[str, np.ndarray]], blocks: Iterable[int] = (0,)):
    """Which logical coordinates each warp of ``blocks`` holds: one row per warp with its existing and
    active lanes and, per coordinate, the lowest, highest and number of distinct values among active lanes.

    ``coords(t)`` returns named index arrays (e.g. ``{"c": ..., "h": ..., "w": ...}``) and optionally an
    ``"active"`` mask (threads that return early, e.g. past the tensor's edge).
    """
    import pandas as pd

    t = threads(launch, list(blocks))
    named = dict(coords(t))
    active = t.exists & np.broadcast_to(named.pop("active", True), t.tid.shape)
    out = {"block": t.block_id[:, 0], "warp": t.warp[:, 0], "lanes": t.exists.sum(1), "active": active.sum(1)}
    for name, v in named.items():
        v = np.broadcast_to(np.asarray(v, dtype=np.int64), t.tid.shape)
        big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        lo, hi = np.where(active, v, big).min(1), np.where(active, v, small).max(1)
        none = ~active.any(1)
        out[f"{name}_lo"] = np.where(none, -1, lo)
        out[f"{name}_hi"] = np.where(none, -1, hi)
        out[f"{name}_distinct"] = _distinct_per_row(v, active)
    return pd.DataFrame(out)


def plot_footprint(addresses: Sequence[int] | np.ndarray, elem_bytes: int = 4,
                   active: Sequence[bool] | np.ndarray | None = None, title: str = "", ax=None):
    """Draw one warp's request in memory: each 128-byte line it touches as a row of 4 sectors (fetched
    sectors shaded), the bytes its active lanes use marked, lines that lie far apart stacked as rows."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    a = np.asarray(addresses, dtype=np.int64)
    act = np.ones(a.shape, dtype=bool) if active is None else np.asarray(active, dtype=bool)
    a = a[act]
    lines = np.unique(np.concatenate([a // LINE, (a + elem_bytes - 1) // LINE]))
    row_of = {int(ln): r for r, ln in enumerate(lines)}
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.28 * len(lines) + 1.3))
    fetched = set()
    for addr in a:
        for byte in range(int(addr), int(addr) + elem_bytes):
            fetched.add(byte // SECTOR)
    for ln, r in row_of.items():
        for s in range(LINE // SECTOR):
            sec = ln * (LINE // SECTOR) + s
            ax.add_patch(Rectangle((s * SECTOR, r), SECTOR, 0.8, facecolor="#f5b7b1" if sec in fetched else "white",
                                   edgecolor="#7f8c8d", lw=0.8))
    for addr in a:
        start = int(addr)
        while start < addr + elem_bytes:  # split an element that crosses a line
            ln = start // LINE
            end = min(int(addr) + elem_bytes, (ln + 1) * LINE)
            ax.add_patch(Rectangle((start - ln * LINE, row_of[ln] + 0.2), end - start, 0.4, facecolor="#c0392b",
                                   edgecolor="none"))
            start = end
    ax.set_xlim(0, LINE)
    ax.set_ylim(len(lines), 0)
    ax.set_xticks(range(0, LINE + 1, SECTOR))
    ax.set_xlabel("byte within the 128-byte line (boxes: 32-byte sectors; shaded: fetched; red: bytes used)")
    base = int(lines[0]) * LINE
    labels = [f"+{(int(ln) * LINE - base):,} B" for ln in lines]
    ax.set_yticks(np.arange(len(lines)) + 0.4, labels, fontsize=7 if len(lines) > 12 else 8)
    ax.grid(False)
    st = warp_request(a, elem_bytes)
    ax.set_title(title or f"{len(a)} lanes: {st['sectors']} sectors in {st['lines']} line(s), "
                          f"{st['efficiency']:.0%} of fetched bytes used")
    return ax


def lane_sectors(addresses: Sequence[int] | np.ndarray, elem_bytes: int = 4,
                 active: Sequence[bool] | np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Which lane touches which sector in one warp's request: (the distinct sector numbers, in order,
    and a bool matrix of lanes × those sectors). Inactive lanes have empty rows."""
    a = np.asarray(addresses, dtype=np.int64)
    act = np.ones(a.shape, dtype=bool) if active is None else np.asarray(active, dtype=bool)
    first, last = a // SECTOR, (a + elem_bytes - 1) // SECTOR
    sectors = np.unique(np.concatenate([first[act], last[act]]))
    touch = (first[:, None] <= sectors[None, :]) & (sectors[None, :] <= last[:, None]) & act[:, None]
    return sectors, touch


def plot_lane_sectors(addresses: Sequence[int] | np.ndarray, elem_bytes: int = 4,
                      active: Sequence[bool] | np.ndarray | None = None, title: str = "", ax=None,
                      colour: str = "#c0392b"):
    """Draw one warp's request as a lanes × sectors grid: a mark where a lane's bytes fall in a sector;
    the columns are the distinct 32-byte sectors the request fetches, in address order (gaps between
    sectors that are not adjacent in memory are drawn as thin lines)."""
    import matplotlib.pyplot as plt

    sectors, touch = lane_sectors(addresses, elem_bytes, active)
    if ax is None:
        _, ax = plt.subplots(figsize=(4, 3))
    ax.imshow(touch, aspect="auto", interpolation="nearest", cmap=plt.matplotlib.colors.ListedColormap(
        ["white", colour]), vmin=0, vmax=1, extent=(0, len(sectors), len(touch), 0))
    for k in np.nonzero(np.diff(sectors) > 1)[0]:  # a jump in memory between neighbouring columns
        ax.axvline(k + 1, color="#7f8c8d", lw=0.8)
    ax.set_xlim(0, max(len(sectors), 4))
    ax.set_ylim(len(touch), 0)
    ax.set_xlabel(f"{len(sectors)} sectors")
    ax.set_ylabel("lane")
    ax.set_yticks([0, 8, 16, 24, 32])
    ax.grid(False)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


# --- The chapter's kernels (kernels/mappings.cu): y = x·a[c] + b[c] over an NCHW tensor, twelve mappings ---

@dataclass(frozen=True)
class Scheme:
    """A thread mapping of the affine kernel: its launch, its accesses, and the coordinates each thread holds."""

    name: str
    launch: Launch
    mapping: Mapping
    coords: Callable[[Threads], dict[str, np.ndarray]]
    about: str


def _nchw(i: np.ndarray, shape: Sequence[int]) -> dict[str, np.ndarray]:
    _, c, h, w = shape
    return {"n": i // (c * h * w), "c": (i // (h * w)) % c, "h": (i // w) % h, "w": i % w}


def affine_schemes(shape: Sequence[int], base: int = 0) -> dict[str, Scheme]:
    """The twelve mappings of kernels/mappings.cu for an (N, C, H, W) float32 tensor, index math mirrored
    line by line; x and y both start ``base`` bytes past a 128-byte boundary (PyTorch's allocator: 0)."""
    n_, c_, h_, w_ = (int(d) for d in shape)
    hw, numel = h_ * w_, n_ * c_ * h_ * w_
    flat, unroll = FLAT_THREADS, UNROLL

    def pair(i, active, elem_bytes=4, tag=""):
        return [Access(f"x{tag}", "ld", i, active, elem_bytes, base),
                Access(f"y{tag}", "st", i, active, elem_bytes, base)]

    def flat_coords(t):
        i = t.gid
        return {**_nchw(i, shape), "active": i < numel}

    def flat_map(t):
        i = t.gid
        return pair(i, i < numel)

    def vec4_coords(t):
        i4 = t.gid
        return {**_nchw(4 * i4, shape), "active": i4 < numel // 4}

    def vec4_map(t):
        i4 = t.gid
        return pair(i4, i4 < numel // 4, elem_bytes=16)

    def chan_index(t):
        g = t.gid
        c, q = g % c_, g // c_
        return ((q // hw) * c_ + c) * hw + q % hw, g < numel

    def chan_coords(t):
        i, act = chan_index(t)
        return {**_nchw(i, shape), "active": act}

    def chan_map(t):
        return pair(*chan_index(t))

    def pix_coords(t):
        q = t.gid
        return {"n": q // hw, "h": (q % hw) // w_, "w": q % w_, "active": q < n_ * hw}

    def pix_map(t):
        q = t.gid
        act = q < n_ * hw
        i0 = (q // hw) * c_ * hw + q % hw
        for c in range(c_):
            yield from pair(i0 + c * hw, act, tag=f"[c={c}]")

    def tile(tw, th, tc):
        ct = -(-c_ // tc)
        launch = Launch((-(-w_ // tw), -(-h_ // th), n_ * ct), (tw, th, tc))

        def idx(t):
            w = t.bx * tw + t.tx
            h = t.by * th + t.ty
            n = t.bz // ct
            c = (t.bz % ct) * tc + t.tz
            return {"n": n, "c": c, "h": h, "w": w, "row": (n * c_ + c) * h_ + h,  # row across planes
                    "active": (w < w_) & (h < h_) & (c < c_)}

        def mapping(t):
            d = idx(t)
            return pair(((d["n"] * c_ + d["c"]) * h_ + d["h"]) * w_ + d["w"], d["active"])

        return launch, mapping, idx

    rg = -(-h_ // 4)

    def rows_coords(t):
        plane = t.bx // rg
        h = (t.bx % rg) * 4 + t.ty
        return {"n": plane // c_, "c": plane % c_, "h": h, "w": t.tx, "active": h < h_}

    def rows_map(t):
        d = rows_coords(t)
        return pair(((d["n"] * c_ + d["c"]) * h_ + d["h"]) * w_ + d["w"], d["active"])

    def unrolled(n_items, elem_bytes):
        """flat_x4 / flat_vec4_x4: block tile of flat·unroll items, thread t takes t + flat·u."""
        def idx(t, u):
            return t.block_id * (flat * unroll) + t.tid + flat * u

        def mapping(t):
            for u in range(unroll):  # all loads first, as the kernel issues them
                yield Access(f"x[{u}]", "ld", idx(t, u), idx(t, u) < n_items, elem_bytes, base)
            for u in range(unroll):
                yield Access(f"y[{u}]", "st", idx(t, u), idx(t, u) < n_items, elem_bytes, base)

        def coords(t):
            i = idx(t, 0) * (elem_bytes // 4)
            return {**_nchw(i, shape), "active": idx(t, 0) < n_items}

        per_thread_items = -(-n_items // unroll)
        launch = Launch(max(1, -(-per_thread_items // flat)), flat)  # ceil twice, as launch_flat does
        return launch, mapping, coords

    vec = hw % 4 == 0 and base % 16 == 0  # planes_vec4_x4 takes float4 accesses only then
    per_thread = unroll if vec else 4 * unroll
    chunks = -(-hw // PLANE_CHUNK)

    def planes_idx(t, u):
        j = t.by * (flat * unroll if vec else PLANE_CHUNK) + t.tid + flat * u  # within the plane
        if vec:
            return t.bx * (hw // 4) + j, j < hw // 4
        return t.bx * hw + j, j < hw

    def planes_map(t):
        eb = 16 if vec else 4
        for u in range(per_thread):
            yield Access(f"x[{u}]", "ld", *planes_idx(t, u), eb, base)
        for u in range(per_thread):
            yield Access(f"y[{u}]", "st", *planes_idx(t, u), eb, base)

    def planes_coords(t):
        i, act = planes_idx(t, 0)
        return {**_nchw(i * (4 if vec else 1), shape), "active": act}

    t7, t8 = tile(18, 7, 4), tile(8, 8, 8)
    u1, u4 = unrolled(numel, 4), unrolled(numel // 4, 16)
    return {
        "flat": Scheme("flat", Launch(-(-numel // flat), flat), flat_map, flat_coords,
                       "one thread per output, flat NCHW index: w fastest across lanes"),
        "flat_vec4": Scheme("flat_vec4", Launch(max(1, -(-(numel // 4) // flat)), flat), vec4_map, vec4_coords,
                            "four consecutive outputs per thread, one float4 load and store"),
        "channel_fastest": Scheme("channel_fastest", Launch(-(-numel // flat), flat), chan_map, chan_coords,
                                  "one thread per output, channel fastest across lanes"),
        "pixel_loop": Scheme("pixel_loop", Launch(-(-(n_ * hw) // flat), flat), pix_map, pix_coords,
                             f"one thread per pixel, looping over the {c_} channels"),
        "tile_7x18x4": Scheme("tile_7x18x4", t7[0], t7[1], t7[2],
                              "blocks of 18 (w) × 7 (h) × 4 (c) threads = 504: 15.75 warps"),
        "tile_8x8x8": Scheme("tile_8x8x8", t8[0], t8[1], t8[2], "blocks of 8 (w) × 8 (h) × 8 (c) threads"),
        "rows_w_x4": Scheme("rows_w_x4", Launch(n_ * c_ * rg, (w_, 4)), rows_map, rows_coords,
                            f"blocks of {w_} (a whole row) × 4 rows"),
        "channel_fastest_smem": Scheme("channel_fastest_smem", Launch(-(-numel // flat), flat), chan_map,
                                       chan_coords, "channel_fastest, coefficients from shared memory"),
        "flat_x4": Scheme("flat_x4", *u1, f"flat, {unroll} floats per thread, {flat} apart, loads first"),
        "flat_vec4_x4": Scheme("flat_vec4_x4", *u4, f"flat_vec4, {unroll} float4 per thread, loads first"),
        "planes_vec4_x4": Scheme("planes_vec4_x4", Launch((n_ * c_, chunks), flat), planes_map, planes_coords,
                                 f"one (n, c) plane per block row, {unroll} float4 per thread"
                                 if vec else f"one (n, c) plane per block row, {per_thread} floats per thread"),
        "flat_vec4_x4_i32": Scheme("flat_vec4_x4_i32", *u4, "flat_vec4_x4 with 32-bit index arithmetic"),
    }


def warp_addresses(mapping: Mapping, launch: Launch, block: int, warp: int, access: int = 0):
    """Byte addresses, active mask and element size of one warp's lanes for the ``access``-th instruction."""
    t = threads(launch, [block])
    for k, acc in enumerate(mapping(t)):
        if k == access:
            idx = np.broadcast_to(np.asarray(acc.index, dtype=np.int64), t.tid.shape)[warp]
            act = t.exists[warp] if acc.active is None else (t.exists & np.broadcast_to(acc.active, t.tid.shape))[warp]
            return acc.base + idx * acc.elem_bytes, act, acc.elem_bytes
    raise IndexError(f"the mapping has no access number {access}")


def model_table(analyses: dict[str, Analysis]):
    """The model's prediction per mapping: sectors per request (loads, stores), load sectors per
    element, efficiency, and how many elements one thread loads."""
    import pandas as pd

    rows = {}
    for k, a in analyses.items():
        s, t = a.summary(), a.table()
        ld = t[t["kind"] == "ld"]
        elems = ld["bytes_used"].sum() / 4
        rows[k] = {"ld sectors/request": s["ld_sectors_per_request"],
                   "st sectors/request": s["st_sectors_per_request"],
                   "sectors/element": s["ld_sectors"] / elems, "efficiency": s["efficiency"],
                   "elements/thread": ld["elem_bytes"].sum() / 4}  # loads per thread × floats
    return pd.DataFrame(rows).T


def resident_threads(threads_per_block: int, registers: int, max_threads: int = 2048, max_blocks: int = 32,
                     regs_per_sm: int = 65536, reg_granule: int = 256) -> int:
    """Threads one SM holds at once for a kernel of ``registers`` per thread (sm_80/sm_90 limits by
    default: 2,048 threads, 32 blocks, 64 K registers allocated per warp in units of 256)."""
    warps = -(-threads_per_block // WARP)
    per_warp = -(-registers * WARP // reg_granule) * reg_granule
    blocks = min(max_blocks, max_threads // threads_per_block, regs_per_sm // (per_warp * warps))
    return blocks * threads_per_block


def in_flight(launches: dict[str, Launch], registers: dict[str, int], median_ms: dict[str, float],
              read_bytes: float, sms: int):
    """Little's law per mapping: resident threads per SM (from its registers), the bytes of x an SM has
    requested when each of them waits on its loads (``LOADED_AHEAD``), and the latency that this and the
    measured read rate imply (bytes in flight = bandwidth × latency; an upper bound, since not every
    thread is waiting all the time)."""
    import pandas as pd

    rows = {}
    for k, launch in launches.items():
        threads_sm = resident_threads(launch.threads_per_block, int(registers[KERNELS[k]]))
        per_sm = threads_sm * LOADED_AHEAD[k]
        rate = read_bytes / (median_ms[k] * 1e-3)
        rows[k] = {"threads/SM": threads_sm, "in flight KiB/SM": per_sm / 1024,
                   "latency µs": per_sm * sms / rate * 1e6}
    return pd.DataFrame(rows).T


def stall_table(ncu_rows: Iterable[dict], variants: Sequence[str]):
    """Warps stalled per issued instruction for the first six ``STALL_REASONS`` (waiting on global memory,
    shared memory, the constant cache or a barrier), one row per variant in ``variants``' order."""
    import pandas as pd

    st = pd.DataFrame(list(ncu_rows)).pivot_table(index="variant", columns="metric", values="value",
                                                  aggfunc="sum")
    st = st.rename(columns={v: k for k, v in NCU_STALLS.items()}).reindex(list(variants))
    return st.filter(items=STALL_REASONS[:6])


def issue_table(ncu_rows: Iterable[dict], ncu_shape: Sequence[int], numel: int, median_ms, copy_ms: float,
                sms: int, clock_mhz: float):
    """Per profiled variant: thread-instructions per element (from ``NCU_ISSUE``'s counts on the profiled
    tensor, which scale with the elements), how busy the issue slots were there, and the least time those
    instructions need on a tensor of ``numel`` elements — every scheduler issuing one warp instruction per
    cycle at ``clock_mhz`` — beside the copy's time and the measured median."""
    import pandas as pd

    df = pd.DataFrame(list(ncu_rows))
    names = {v: k for k, v in NCU_ISSUE.items()}
    wide = (df[df["metric"].isin(names)].pivot_table(index="variant", columns="metric", values="value",
                                                      aggfunc="sum").rename(columns=names))
    per_elem = WARP * wide["warp instructions"] / float(np.prod(ncu_shape))
    slots = sms * ISSUE_PER_CLOCK * clock_mhz * 1e6  # warp instructions per second, the whole GPU
    out = pd.DataFrame({"instructions/element": per_elem, "issue slots busy %": wide["issue slots busy %"],
                        "issue floor ms": 1e3 * per_elem * numel / WARP / slots})
    out["copy ms"] = copy_ms
    out["median ms"] = pd.Series(median_ms).reindex(out.index)
    out["median / max(floors)"] = out["median ms"] / out[["issue floor ms", "copy ms"]].max(axis=1)
    return out.sort_values("median ms")


def ncu_script(shape: Sequence[int], chapter: str) -> str:
    """The program Nsight Compute profiles: every mapping of kernels/mappings.cu once, each inside its
    NVTX range ``<chapter>/<mapping>``, then the method chapter's ``y = s·x`` (kernels/scale.cu) inside
    ``<chapter>/scale_ch0``, on an input of ``shape`` — one kernel per range, in the order of
    ``ncu_variants()``."""
    return f"""
import torch, kernelbook as kb
mod, smod = kb.build.load("mappings"), kb.build.load("scale")
x = kb.check.rand({tuple(shape)}, seed=0, device="cuda"); y = torch.empty_like(x)
a, b = kb.check.rand([{shape[1]}], seed=1), kb.check.rand([{shape[1]}], seed=2)
for m in mod.mappings():
    with kb.timing.nvtx_range("{chapter}", m):
        mod.affine(x, a, b, m, y)
with kb.timing.nvtx_range("{chapter}", "scale_ch0"):
    smod.scale_out(x, 2.0, y)
torch.cuda.synchronize()
"""


def ncu_variants() -> list[str]:
    """The ranges ``ncu_script`` profiles, in launch order: the mappings, then the method chapter's scale."""
    return [*KERNELS, "scale_ch0"]
