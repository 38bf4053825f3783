"""What the reader sees: the book's one table helper, kernel-name shortening, and kernel excerpts.

Every table in the book goes through ``table``: it never truncates (long text wraps), formats each
column by kind (integers with separators, times to 3 significant figures, errors as ``1.2e-07``,
percentages), and puts long tables under a titled dropdown. Kernel sources are shown as guided
excerpts between ``// excerpt: <name>`` and ``// end excerpt: <name>`` markers in the ``.cu`` file,
with the file's own line numbers; the whole file sits behind a dropdown (``source``).
"""

from __future__ import annotations

import html
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .paths import KERNELS

COLLAPSE_ROWS = 12  # tables longer than this go under a dropdown unless told otherwise
# The checker's column names (kb.check.report), as a reader should read them: the tolerance bounds the
# norm-wise relative error, not the largest absolute one.
HEADERS = {"rel_err": "rel. error (norm-wise)", "max_abs_err": "max abs error",
           "tol": "tolerance (on rel. error)", "unwritten": "unwritten", "passed": "passed"}

# A column's kind, from its name when not given: the first pattern that matches decides.
_KIND_BY_NAME = [
    (re.compile(r"err|tol|residual", re.I), "err"),
    (re.compile(r"%|percent|pct", re.I), "pct"),
    (re.compile(r"(^|[ _(])(ms|us|µs|s)\)?$|median|q20|q80|time", re.I), "time"),
    (re.compile(r"(^| )×|ratio|/ ", re.I), "ratio"),
]


def _is_number(v) -> bool:
    return isinstance(v, numbers.Number) and not isinstance(v, bool)


def _fmt_int(v) -> str:
    return f"{int(v):,}"


def _fmt_sig(v, figs: int = 3) -> str:
    """Three significant figures, without scientific notation for ordinary magnitudes."""
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 10**figs:
        return f"{v:,.0f}"
    if a < 1e-3:
        return f"{v:.{figs - 1}e}"
    decimals = max(0, figs - 1 - math.floor(math.log10(a)))
    return f"{v:.{decimals}f}"


FORMATS: dict[str, Callable[[object], str]] = {
    "int": _fmt_int,
    "time": _fmt_sig,
    "num": _fmt_sig,
    "err": lambda v: f"{v:.1e}",
    "pct": lambda v: f"{v:.1f}",
    "ratio": lambda v: f"{v:.2f}",
    "sci": lambda v: f"{v:.2e}",
    "text": str,
}


def _infer_kind(name: str, values: Sequence) -> str:
    nums = [v for v in values if _is_number(v) and not (isinstance(v, float) and math.isnan(v))]
    if not nums or len(nums) < sum(v is not None for v in values) // 2:
        return "text"
    for pat, kind in _KIND_BY_NAME:
        if pat.search(str(name)):
            return kind
    if all(float(v).is_integer() for v in nums) and all(abs(v) < 2**53 for v in nums):
        return "int"
    return "num"


def _cell(v, kind: str | Callable) -> tuple[str, bool]:
    """(escaped text, is numeric) for one value."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "", True
    if isinstance(v, bool):
        return ("yes" if v else "no"), False
    if hasattr(v, "item") and not isinstance(v, str):
        v = v.item()
    if callable(kind):
        return html.escape(str(kind(v))), _is_number(v)
    if isinstance(kind, str) and kind in FORMATS and _is_number(v):
        if isinstance(v, float) and math.isinf(v):
            return ("∞" if v > 0 else "−∞"), True
        return html.escape(FORMATS[kind](v)), True
    if isinstance(kind, str) and "{" in kind and _is_number(v):
        return html.escape(kind.format(v)), True
    return html.escape(str(v)), False


def _frame(data):
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, pd.Series):
        return data.to_frame()
    if isinstance(data, Mapping):
        vals = list(data.values())
        if vals and all(isinstance(v, Mapping) for v in vals):
            return pd.DataFrame.from_dict(data, orient="index")
        return pd.Series(data).to_frame(name="value")
    return pd.DataFrame(list(data))


def _header(text: str) -> str:
    """A column header as HTML: words wrap whole; an identifier too long for a narrow column (a metric
    or variable name) may also break after each ``_``, ``.`` or ``/`` in it, never inside a word."""
    words = []
    for w in html.escape(text).split(" "):
        words.append(re.sub(r"([_./])(?=\w)", r"\1<wbr>", w) if len(w) > 12 else w)
    return " ".join(words)


def _breakable(text: str) -> str:
    """Escaped HTML text whose long identifiers (``compile_eval_max_autotune``) may break after an ``_``,
    so a column of variant names can be narrower than its longest name."""
    return " ".join(re.sub(r"_(?=\w)", "_<wbr>", w) if len(w) > 16 else w for w in text.split(" "))


def table_html(data, formats: Mapping[str, str | Callable] | None = None, title: str | None = None,
               collapse: bool | None = None, index: bool | str | None = None) -> str:
    """The HTML of ``table`` (see there)."""
    import pandas as pd

    df = _frame(data)
    formats = dict(formats or {})
    if isinstance(index, str):  # the row labels, under this header
        df, index = df.rename_axis(index), True
    show_index = index if index is not None else not isinstance(df.index, pd.RangeIndex)
    cols = list(df.columns)
    kinds = {c: formats.get(str(c)) or _infer_kind(str(c), df[c].tolist()) for c in cols}
    head = "".join(f"<th>{_header(HEADERS.get(str(c), str(c)))}</th>"
                   for c in ([df.index.name or ""] if show_index else []) + cols)
    rows = []
    for idx, row in zip(df.index, df.itertuples(index=False), strict=True):
        cells = [f'<th class="kb-row">{_breakable(html.escape(str(idx)))}</th>'] if show_index else []
        for c, v in zip(cols, row, strict=True):
            text, numeric = _cell(v, kinds[c])
            if numeric:
                cells.append(f'<td class="kb-num">{text}</td>')
            elif any(len(word) > 24 for word in text.split()):  # a kernel name: may break anywhere
                cells.append(f'<td class="kb-long">{text}</td>')
            else:  # words stay whole; identifiers may break after an underscore
                cells.append(f"<td>{_breakable(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    body = (f'<table class="kb-table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")
    collapse = len(df) > COLLAPSE_ROWS if collapse is None else collapse
    if collapse:
        summary = html.escape(title or "Table")
        return (f'<details class="kb-dropdown"><summary>{summary} ({len(df)} rows)</summary>'
                f'<div class="kb-table-wrap">{body}</div></details>')
    caption = f'<p class="kb-caption">{html.escape(title)}</p>' if title else ""
    return f'<div class="kb-table-wrap">{caption}{body}</div>'


def table(data, formats: Mapping[str, str | Callable] | None = None, title: str | None = None,
          collapse: bool | None = None, index: bool | str | None = None):
    """Show ``data`` (a DataFrame, Series, dict of rows, or list of row dicts) as the book's table.

    ``formats`` maps a column to a kind — ``int``, ``time`` (3 significant figures), ``num``,
    ``err`` (``1.2e-07``), ``sci``, ``pct`` (``12.3``), ``ratio`` (``1.23``), ``text`` — a format
    string, or a function; other columns get a kind from their name and values. Tables of more than
    ``COLLAPSE_ROWS`` rows go under a dropdown titled ``title`` (``collapse`` forces either way). The row
    labels (a non-default index) are shown under the index's name; ``index="mapping"`` names them,
    ``index=False`` hides them.
    """
    from IPython.display import HTML

    return HTML(table_html(data, formats, title, collapse, index))


# --------------------------------------------------------------------------------------- kernel names

def _strip_templates(s: str, keep_depth: int) -> str:
    """Drop template arguments nested deeper than ``keep_depth`` levels."""
    out, depth = [], 0
    for ch in s:
        if ch == "<":
            depth += 1
            if depth > keep_depth:
                continue
        elif ch == ">":
            depth -= 1
            if depth >= keep_depth:
                continue
        elif depth > keep_depth:
            continue
        out.append(ch)
    return re.sub(r"\s+>", ">", "".join(out).replace("<>", ""))


def kernel_name(name: str, width: int = 56) -> str:
    """A kernel's name as a reader wants it: no return type, namespaces or parameter list, and
    template arguments only while they fit in ``width`` characters. The base name is never cut (a
    long one wraps in the table), so the meaningful parts — ``tf32``, ``f32``, tile sizes — stay.

    'void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>, at::detail::Array<char*,
    3> >(int, ...)' → 'vectorized_elementwise_kernel<4, MulFunctor, Array>'
    """
    if name.startswith("_ZN7cutlass"):  # a mangled CUTLASS kernel: its kind, first tile and math, in words
        kind = next((k for k in ("ImplicitGemmConvolution", "Gemm") if k in name), "Kernel")
        tile = re.search(r"GemmShapeILi(\d+)ELi(\d+)ELi(\d+)E", name)
        parts = [f"cutlass {kind}", "×".join(tile.groups()) if tile else "",
                 *(w for w in ("FewChannels", "FastF32") if w in name)]
        return " ".join(p for p in parts if p)
    s = re.sub(r"\((anonymous namespace|unnamed)\)::|<unnamed>::", "", name.strip())
    s = s.removeprefix("void ").strip()
    depth = 0
    for i, ch in enumerate(s):  # the parameter list: the first '(' outside template brackets
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i > 0:
            s = s[:i]
            break
    s = re.sub(r"\b[A-Za-z_]\w*::", "", s)  # namespaces and enclosing classes
    if m := re.fullmatch(r"Kernel2?<(\w+)>", s):  # a generic launcher (cuDNN's CUTLASS kernels): its argument
        s = m.group(1)
    s = re.sub(r"\((?:int|unsigned int|long|bool|unsigned|char)\)", "", s)
    s = re.sub(r"\s+", " ", s).strip()
    if len(s) > width:
        s = _strip_templates(s, 1)  # template arguments of template arguments go first
    if len(s) > width and "<" in s:  # then trailing arguments, while at least one is left
        base, args = s[: s.index("<")], [a.strip() for a in s[s.index("<") + 1: s.rindex(">")].split(",")]
        while len(args) > 1 and len(f"{base}<{', '.join(args)}>") > width:
            args.pop()
        s = f"{base}<{', '.join(args)}>" if len(f"{base}<{args[0]}>") <= width else base
    return s


# ------------------------------------------------------------------------------------- kernel sources

_START = re.compile(r"^\s*//\s*excerpt:\s*(\S+)\s*$")
_END = re.compile(r"^\s*//\s*end excerpt:\s*(\S+)\s*$")
_LEXER = {".cu": "cuda", ".cuh": "cuda", ".cpp": "cpp", ".h": "cpp", ".py": "python"}


def _path(file: str | Path) -> Path:
    p = Path(file)
    return p if p.is_absolute() else KERNELS / p


def span_lines(file: str | Path, start: str, end: str) -> tuple[int, list[str]]:
    """(first line number, lines) of ``file`` from the first line containing ``start`` through the first
    line after it that begins with ``end`` (``"}"``: a top-level definition's closing brace), both kept.
    For a region with no excerpt markers, where adding them would change a recorded source hash."""
    lines = _path(file).read_text().splitlines()
    first = next((i for i, line in enumerate(lines) if start in line), None)
    if first is None:
        raise KeyError(f"no line containing {start!r} in {_path(file).name}")
    last = next((i for i in range(first + 1, len(lines)) if lines[i].startswith(end)), None)
    if last is None:
        raise KeyError(f"no line beginning with {end!r} after {start!r} in {_path(file).name}")
    return first + 1, lines[first:last + 1]


def excerpt_lines(file: str | Path, name: str | tuple[str, str]) -> tuple[int, list[str]]:
    """(first line number, lines) of the excerpt ``name`` in ``file`` (markers excluded); a pair
    ``(start, end)`` names an unmarked region instead (``span_lines``)."""
    if isinstance(name, tuple):
        return span_lines(file, *name)
    lines = _path(file).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if (m := _START.match(line)) and m.group(1) == name), None)
    if start is None:
        have = sorted({m.group(1) for line in lines if (m := _START.match(line))})
        raise KeyError(f"no excerpt {name!r} in {_path(file).name}; it has: {', '.join(have) or 'none'}")
    end = next((i for i in range(start + 1, len(lines)) if (m := _END.match(lines[i])) and m.group(1) == name), None)
    if end is None:
        raise KeyError(f"excerpt {name!r} in {_path(file).name} has no '// end excerpt: {name}' line")
    body = [line for line in lines[start + 1:end] if not (_START.match(line) or _END.match(line))]
    return start + 2, body


def _highlight(code: str, suffix: str, first_line: int, anchor: str) -> str:
    """Highlighted code with the file's line numbers, each line its own block (ids ``anchor-N``), so a
    line too long for the column wraps with a hanging indent and never runs back under the numbers."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name

    last = first_line + code.count("\n")
    fmt = HtmlFormatter(linenos="inline", linenostart=first_line, cssclass="highlight", linespans=anchor)
    body = highlight(code, get_lexer_by_name(_LEXER.get(suffix, "text")), fmt)
    return f'<div class="kb-code" style="--kb-digits: {len(str(last))}ch">{body}</div>'


def excerpt_html(file: str | Path, name: str | tuple[str, str]) -> str:
    p = _path(file)
    first, body = excerpt_lines(p, name)
    label = f"kernels/{p.name}, lines {first}–{first + len(body) - 1}"
    anchor = f"{p.stem}-{name if isinstance(name, str) else f'lines-{first}'}"
    code = _highlight(chr(10).join(body), p.suffix, first, anchor)
    return (f'<div class="kb-excerpt"><p class="kb-caption">{html.escape(label)}</p>'
            f'<div class="highlight-cuda notranslate">{code}</div></div>')


def excerpt(file: str | Path, name: str | tuple[str, str]):
    """The lines of ``file`` (in ``kernels/``) between ``// excerpt: name`` and ``// end excerpt: name``,
    highlighted, with the file's own line numbers; ``name`` = ``(start, end)``: an unmarked region
    (``span_lines``)."""
    from IPython.display import HTML

    return HTML(excerpt_html(file, name))


SHARED_FILES = ("torch_checks.h",)  # the argument checks every binding includes: not part of one kernel's story


def source(*files: str | Path, title: str | None = None):
    """Whole source files (in ``kernels/``) behind one closed dropdown, highlighted, with line numbers.

    A bare kernel name (``"bn_train"``) stands for all of its files — its .cu, launch-API header, binding and
    the shared headers it includes — except the argument checks every binding shares."""
    from IPython.display import HTML

    from .build import sources

    files = tuple(q for f in files for q in ([p for p in sources(str(f)) if p.name not in SHARED_FILES]
                                             if "." not in str(f) else [f]))
    parts = []
    for f in files:
        p = _path(f)
        text = p.read_text().rstrip("\n")  # markers kept, so line numbers agree with the excerpts'
        n = len(text.splitlines())
        anchor = f"{p.stem}-{p.suffix[1:]}"
        parts.append(f'<p class="kb-caption">kernels/{html.escape(p.name)} ({n} lines)</p>'
                     f'<div class="highlight-cuda notranslate kb-scroll">{_highlight(text, p.suffix, 1, anchor)}</div>')
    label = title or "The whole source: " + ", ".join(f"kernels/{_path(f).name}" for f in files)
    return HTML(f'<details class="kb-dropdown"><summary>{html.escape(label)}</summary>{"".join(parts)}</details>')
