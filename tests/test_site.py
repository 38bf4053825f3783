"""The built site, opened page by page in headless Chromium, as a reader's browser would show it.

The book is built once (test_book's build), served on 127.0.0.1, and every page is loaded in Debian's
Chromium, driven by Playwright. Each page must answer 200, show no error output, load every image,
leave no raw ``$…$`` math behind (MathJax, served by the site itself, rendered it) and make no request
to any host but the local server: every request is intercepted, and one to any other host is refused
before it leaves the machine and fails the test. A screenshot of each page's first screen is kept
beside the built site (``<build>/screenshots/``) for a human to look at.

The page's layout is measured twice, as it opens (dropdowns closed) and with every dropdown opened:
its width and height, tables that overflow their box or show a pandas index, figures without alt text
or caption, project-schedule wording in the prose, and wrapped code lines that run under the line numbers.
"""

from __future__ import annotations

import base64
import functools
import html.parser
import http.server
import json
import os
import re
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CHROMIUM_CANDIDATES = [os.environ.get("KERNELBOOK_CHROMIUM", ""), "chromium", "chromium-browser", "google-chrome"]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
LOCAL_SCHEMES = {"data", "blob", "about", "chrome", "devtools", "chrome-extension"}
INSTALL_HINT = "install it with `apt-get install -y chromium` (.ci/run does), or set KERNELBOOK_CHROMIUM"
# Debian's Chromium, headless and quiet: without the background-networking flags it dials out by itself.
# Its resolver maps every host but localhost to 'not found', so nothing leaves the machine even for
# requests that the page does not make (and that Playwright's routing does not see).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-default-apps", "--dns-prefetch-disable",
                  "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1"]
WINDOW = {"width": 1280, "height": 900}  # CSS px: the reader's window (a laptop), screenshots included
PAGE_SECONDS = 120  # the most one page may take to load and settle before it counts as broken


def chromium() -> str | None:
    """The Chromium executable, if one is installed."""
    for c in CHROMIUM_CANDIDATES:
        path = shutil.which(c) if c else None
        if path:
            return path
    return None


def need_chromium() -> str:
    """Chromium's path; a clear failure on CI (which must install it), a clear skip elsewhere."""
    exe = chromium()
    if exe is None:
        msg = f"the browser test needs headless Chromium, which is not installed: {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def is_local(url: str) -> bool:
    """True for URLs served by this machine's test server (or that need no network at all)."""
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    return parts.scheme in ("http", "https", "ws", "wss") and (parts.hostname or "") in {h.strip("[]") for h in
                                                                                         LOCAL_HOSTS}


# ---------------------------------------------------------------------------------------------- server

class _Handler(http.server.SimpleHTTPRequestHandler):
    statuses: list[tuple[str, int]]

    def log_message(self, format, *args):  # noqa: A002  (the base class's name)
        pass

    def send_response(self, code, message=None):
        self.statuses.append((self.path, code))
        super().send_response(code, message)


@contextmanager
def serve(root: Path):
    """Serve ``root`` on 127.0.0.1 (a free port) in a thread; yields (base URL, [(path, status), ...])."""
    statuses: list[tuple[str, int]] = []
    handler = functools.partial(type("H", (_Handler,), {"statuses": statuses}), directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", statuses
    finally:
        httpd.shutdown()
        httpd.server_close()


# --------------------------------------------------------------------------------------------- browser

class Browser:
    """Headless Chromium with one page at WINDOW's size, driven by Playwright's sync API.

    Every request the page makes is routed through ``_route``: local ones continue, any other is aborted
    before it is sent and recorded in ``external`` (websockets too).
    """

    def __init__(self, driver, exe: str):
        self.browser = driver.chromium.launch(executable_path=exe, args=CHROMIUM_FLAGS, headless=True)
        self.context = self.browser.new_context(viewport=WINDOW, device_scale_factor=1, service_workers="block")
        self.context.route("**/*", self._route)
        self.context.route_web_socket(re.compile(".*"), self._route_web_socket)
        self.page = self.context.new_page()
        self.page.set_default_timeout(PAGE_SECONDS * 1000)
        self.external: list[str] = []
        self.requested: list[str] = []
        self.responses: list[tuple[int, str]] = []
        self.js_errors: list[str] = []
        self.page.on("request", lambda r: self.requested.append(r.url))
        self.page.on("response", lambda r: self.responses.append((r.status, r.url)))
        self.page.on("pageerror", lambda e: self.js_errors.append(f"{e.name}: {e.message}"))

    def _route(self, route) -> None:
        url = route.request.url
        if is_local(url):
            route.continue_()
        else:
            self.external.append(url)
            route.abort("blockedbyclient")

    def _route_web_socket(self, ws) -> None:
        if is_local(ws.url):
            ws.connect_to_server()
        else:  # left unconnected: the page talks to no server at all
            self.external.append(ws.url)

    def evaluate(self, function: str, timeout: float = PAGE_SECONDS):
        """The value of an (async) JavaScript function run in the page; an error if it takes over ``timeout`` s."""
        ms = int(timeout * 1000)
        return self.page.evaluate(f"""Promise.race([({function})(), new Promise((_, no) => setTimeout(
            () => no(new Error('the page script did not finish in {timeout:g} s')), {ms}))])""")

    def open(self, url: str) -> dict:
        """Load ``url`` and return what a reader would see (see PAGE_REPORT), plus status and requests."""
        for seen in (self.external, self.requested, self.responses, self.js_errors):
            seen.clear()
        response = self.page.goto(url, wait_until="load")
        report = self.evaluate(PAGE_REPORT)
        report["status"] = response.status if response else None
        report["failed_responses"] = [f"{status} {u}" for status, u in self.responses if status >= 400]
        report["requested"] = list(self.requested)
        report["external"] = sorted(set(self.external) | {u for u in self.requested if not is_local(u)})
        report["js_errors"] = list(self.js_errors)
        return report

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))

    def close(self) -> None:
        try:
            self.context.close()
        finally:
            self.browser.close()


# What a page shows once it has settled (MathJax done, images loaded or failed), measured twice: as it
# opens, dropdowns closed; then with every dropdown, <details> and toggle opened, which is undone at the
# end so that the screenshot shows the first screen a reader gets.
PAGE_REPORT = r"""
async () => {
  const settle = (ms) => new Promise(r => setTimeout(r, ms));
  const frames = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  // index.html redirects to intro.html: wait for whichever document ends up shown
  for (let i = 0; i < 100 && !(document.body && document.readyState === 'complete'); i++) await settle(50);
  const mjScript = document.querySelector('script[src*="mathjax"]');
  const math = Array.from(document.querySelectorAll('.math'));
  if (mjScript && math.length) {
    for (let i = 0; i < 200 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++) await settle(50);
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  }
  const imagesLoaded = () => Promise.all(Array.from(document.images).map(i => {
    i.loading = 'eager';
    return i.complete ? null : new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); });
  }));
  await imagesLoaded();
  const imgs = Array.from(document.images);
  const skip = 'script, style, pre, code, textarea, mjx-container, .math';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const raw = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement && n.parentElement.closest(skip)) continue;
    const m = n.textContent.match(/\$[^$\s][^$]*\$|\\\(|\\\[/);
    if (m) raw.push(m[0].slice(0, 80));
  }
  const errorSel = '.output.error, .output.traceback, .output.stderr, div.stderr, .cell_output .traceback';
  const errors = Array.from(document.querySelectorAll(errorSel)).map(e => e.textContent.slice(0, 200));
  const text = document.body.innerText;
  if (text.includes('Traceback (most recent call last)')) errors.push('a traceback in the page text');
  // What a reader meets: truncated or cramped tables, raw Markdown, code or math wider than the page.
  const visible = (e) => !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length);
  const cells = Array.from(document.querySelectorAll('article td, article th'))
    .filter(c => !c.closest('.highlight, .linenos, pre') && visible(c));
  const truncated = cells.filter(c => /…|\.\.\.$/.test(c.innerText.trim())).map(c => c.innerText.trim().slice(0, 80));
  const cramped = cells.filter(c => {
    const st = getComputedStyle(c);
    return parseFloat(st.paddingLeft) + parseFloat(st.paddingRight) < 4 && c.innerText.trim();
  }).map(c => c.innerText.trim().slice(0, 40));
  const article = document.querySelector('article') || document.body;
  const prose = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  const rawMd = [];
  for (let n = prose.nextNode(); n; n = prose.nextNode()) {
    const el = n.parentElement;
    const skipMd = 'pre, code, script, style, .highlight, mjx-container, .math, .cell_input, .output, textarea';
    if (!el || el.closest(skipMd)) continue;
    const m = n.textContent.match(/`[^`\s][^`]*`|\*\*[^*\s][^*]*\*\*|\\_|\[[^\]]+\]\([^)]+\)/);
    if (m) rawMd.push(m[0].slice(0, 80));
  }
  const wide = Array.from(document.querySelectorAll('article pre')).filter(visible)
    .filter(p => p.scrollWidth > p.clientWidth + 2)
    .map(p => (p.innerText.split('\n').find(l => l.length > 88) || p.innerText.split('\n')[0]).slice(0, 100));
  const articleRight = article.getBoundingClientRect().right;
  const clippedMath = Array.from(document.querySelectorAll('article mjx-container[display="true"]'))
    .filter(visible).filter(m => m.scrollWidth > m.clientWidth + 2 ||
      (m.firstElementChild && m.firstElementChild.getBoundingClientRect().right > articleRight + 2))
    .map(m => m.textContent.slice(0, 60));
  const launch = Array.from(document.querySelectorAll('a[href]')).map(a => a.href)
    .filter(h => /colab\.research|mybinder|REPLACE-ME/i.test(h));

  // ---- helpers of the layout checks
  const oneLine = (s, n) => (s || '').replace(/\s+/g, ' ').trim().slice(0, n);
  const section = (e) => { const s = e.closest('section[id]'); return s ? '#' + s.id : '(top)'; };
  const tag = (e) => `<${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''}` +
    Array.from(e.classList).slice(0, 2).map(c => '.' + c).join('') + '>';
  const describe = (e) => {
    const words = oneLine(e.innerText || e.textContent, 40);
    return tag(e) + (words ? ` "${words}"` : '') + ` in ${section(e)}`;
  };
  const pageHeight = () => Math.max(document.documentElement.scrollHeight, document.body.scrollHeight);
  // The page's scroll width and, when it is wider than the window, the outermost element reaching
  // furthest right that no scrolling or clipping box (nor a fixed one) holds in.
  const pageWidth = () => {
    const width = document.documentElement.scrollWidth;
    if (width <= window.innerWidth) return {width, widest: null};
    const held = new Map();
    const isHeld = (e) => {
      if (!e || e === document.body) return false;
      if (!held.has(e)) {
        const st = getComputedStyle(e);
        held.set(e, st.position === 'fixed' || isHeld(e.parentElement) ||
          (e.parentElement !== document.body && getComputedStyle(e.parentElement).overflowX !== 'visible'));
      }
      return held.get(e);
    };
    let widest = null, right = -Infinity;
    for (const e of document.body.querySelectorAll('*')) {
      const r = e.getBoundingClientRect();
      if (r.right + window.scrollX > right && (r.width || r.height) && !isHeld(e)) {
        widest = e; right = r.right + window.scrollX;
      }
    }
    return {width, widest: widest && `${describe(widest)}, right edge at ${Math.round(right)} px`};
  };
  // Open every dropdown of the article: <details> (myst-nb's hide-input/hide-output toggles,
  // sphinx-design dropdowns, the book's own) and sphinx-togglebutton's toggles; returns the undo.
  const openAll = async () => {
    const undo = [];
    for (const d of article.querySelectorAll('details:not([open])')) {
      d.open = true;
      undo.push(() => { d.open = false; });
    }
    for (const t of article.querySelectorAll('.toggle-hidden')) {
      const button = t.querySelector('.toggle-button') || document.querySelector(`[data-target="${t.id}"]`);
      if (button) { button.click(); undo.push(() => button.click()); }
    }
    await imagesLoaded();
    await frames();
    return () => { undo.reverse().forEach(f => f()); };
  };
  // The box a table is seen through: its nearest ancestor that scrolls or clips, else the article.
  const viewBox = (e) => {
    for (let p = e.parentElement; p && p !== article; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== 'visible') return p;
    }
    return article;
  };
  const tableReport = (t) => {
    const rows = Array.from(t.rows);
    const headRows = t.tHead ? Array.from(t.tHead.rows) : rows.slice(0, 1);
    const bodyRows = rows.filter(r => !headRows.includes(r));
    const head = headRows.length ? Array.from(headRows[0].cells).map(c => oneLine(c.innerText, 30)) : [];
    const box = viewBox(t);
    const tr = t.getBoundingClientRect(), br = box.getBoundingClientRect();
    const boxLeft = br.left + box.clientLeft, boxRight = boxLeft + box.clientWidth;
    const overflowX = getComputedStyle(box).overflowX;
    // a pandas index left in: a column under an empty header cell, all its cells distinct integers
    const at = (row, col) => {
      let x = 0;
      for (const c of row.cells) { if (col < x + c.colSpan) return c; x += c.colSpan; }
      return null;
    };
    const index = [];
    if (headRows.length && bodyRows.length) {
      let x = 0;
      for (const h of headRows[0].cells) {
        const values = bodyRows.map(r => at(r, x)).map(c => (c ? c.innerText.trim() : ''));
        if (!h.innerText.trim() && values.every(v => /^-?\d+$/.test(v)) && new Set(values).size === values.length) {
          index.push({column: x + 1, values: values.slice(0, 8)});
        }
        x += h.colSpan;
      }
    }
    return {
      where: `${section(t)}${t.className ? ' table.' + t.classList[0] : ''}`,
      head: head.slice(0, 4), columns: head.length, width: Math.round(Math.max(tr.width, t.scrollWidth)),
      box: tag(box), box_width: box.clientWidth,
      overflows: tr.left < boxLeft - 1 || tr.right > boxRight + 1 || t.scrollWidth > t.clientWidth + 1,
      scrollbar: /auto|scroll/.test(overflowX) && box.scrollWidth > box.clientWidth + 1,
      index_columns: index,
    };
  };
  const figureReport = (i) => {
    const fig = i.closest('figure, div.figure');
    const cap = fig && fig.querySelector('figcaption, .caption');
    return {src: (i.getAttribute('src') || '').split('/').pop().slice(0, 80), alt: i.getAttribute('alt'),
            where: section(i), figure: !!fig, caption: cap && visible(cap) ? oneLine(cap.innerText, 80) : ''};
  };
  // The article's prose as the reader sees it, block by block: code blocks, code cells and their
  // outputs (but Markdown ones), math and hidden text left out; inline code kept.
  const proseBlocks = () => {
    const leaveOut = 'pre, .highlight, .cell_input, script, style, textarea, mjx-container, .math, a.headerlink';
    const blockSel = 'p, li, dt, dd, td, th, h1, h2, h3, h4, h5, h6, figcaption, caption, summary, blockquote, div';
    const blocks = [];
    let last = null;
    const w = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
    for (let n = w.nextNode(); n; n = w.nextNode()) {
      const el = n.parentElement;
      const output = el && el.closest('.cell_output') && !el.closest('.text_markdown');
      if (!el || output || el.closest(leaveOut) || !visible(el)) continue;
      const block = el.closest(blockSel) || article;
      if (block !== last) { blocks.push([section(el), '']); last = block; }
      blocks[blocks.length - 1][1] += n.textContent;
    }
    return blocks.map(([where, s]) => [where, s.replace(/\s+/g, ' ').trim()]).filter(([, s]) => s);
  };
  // Code shown with line numbers: every line box of its code must start right of the numbers' gutter.
  const codeName = (pre) => {
    const wrap = pre.closest('[class*="highlight-"]') || pre;
    for (let s = wrap.previousElementSibling; s; s = s.previousElementSibling) {
      if (s.matches('.kb-caption')) return oneLine(s.innerText, 80);
    }
    const d = pre.closest('details');
    const summary = d && d.querySelector('summary');
    return summary ? `"${oneLine(summary.innerText, 60)}" in ${section(pre)}` : `code in ${section(pre)}`;
  };
  const gutterReport = (box) => {
    const numbers = Array.from(box.querySelectorAll('.linenos'));
    const gutter = Math.max(...numbers.map(n => n.getBoundingClientRect().right));
    const left = box.getBoundingClientRect().left;
    const under = new Map();  // line number -> leftmost start of its text, px from the block's left edge
    const w = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
    let line = '?';
    for (let n = w.nextNode(); n; n = w.nextNode()) {
      const number = n.parentElement.closest('.linenos');
      if (number) { line = number.textContent.trim(); continue; }
      if (!n.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(n);
      for (const r of range.getClientRects()) {
        if (r.width > 0 && r.left < gutter - 1) under.set(line, Math.min(under.get(line) ?? Infinity, r.left - left));
      }
    }
    return {where: codeName(box), lines: numbers.length, gutter: Math.round(gutter - left),
            under: Array.from(under, ([l, x]) => [l, Math.round(x)])};
  };

  // ---- as the page opens, dropdowns closed
  const height = pageHeight();
  const widthClosed = pageWidth();
  // ---- every dropdown opened
  const closeAll = await openAll();
  const heightOpened = pageHeight();
  const widthOpened = pageWidth();
  const tables = Array.from(article.querySelectorAll('table'))
    .filter(t => !t.closest('.highlight, .highlighttable, pre') && visible(t)).map(tableReport);
  const figures = Array.from(article.querySelectorAll('img')).filter(i => !/logo|icon/i.test(`${i.className} ${i.src}`))
    .filter(i => !(i.naturalWidth && i.naturalWidth <= 32 && i.naturalHeight <= 32)).map(figureReport);
  const blocks = proseBlocks();
  const gutters = Array.from(article.querySelectorAll('pre, table.highlighttable'))
    .filter(b => !(b.tagName === 'PRE' && b.closest('table.highlighttable')))
    .filter(b => b.querySelector('.linenos') && visible(b))
    .map(gutterReport);
  closeAll();
  await frames();
  return {
    height: height,
    height_opened: heightOpened,
    page_width: {closed: widthClosed, opened: widthOpened},
    tables: tables,
    figures: figures,
    prose: blocks,
    gutters: gutters,
    truncated_cells: truncated,
    cramped_cells: cramped,
    raw_markdown: rawMd,
    wide_code: wide,
    clipped_math: clippedMath,
    launch_links: launch,
    title: document.title,
    images: imgs.map(i => ({src: i.currentSrc || i.src, width: i.naturalWidth})),
    math: math.length,
    math_unrendered: math.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 80)),
    mathjax_loaded: !!window.MathJax && !!window.MathJax.version,
    raw_math: raw,
    errors: errors,
  };
}
"""


HEIGHT_BUDGET = 16_000  # CSS px at 1280 px wide, dropdowns closed: a chapter read in one sitting
CAPSTONE_BUDGET = 20_000
OPENED_BUDGET = 32_000  # the same, with every dropdown opened: a reader who opens everything
CAPSTONE_OPENED_BUDGET = 40_000
PAGE_WIDTH = WINDOW["width"]  # no page scrolls sideways in the reader's window

# Project-schedule wording, which belongs in notes/ and commit messages, not in what a reader reads: each
# a regular expression searched in a page's prose (code blocks and code cells' outputs left out).
INTERNAL_WORDING = {
    "our target": re.compile(r"\bour targets?\b", re.IGNORECASE),
    "missed": re.compile(r"\bmissed\b", re.IGNORECASE),
    "what would come next": re.compile(r"\bwhat would come next\b", re.IGNORECASE),
    "notes/": re.compile(r"\bnotes/", re.IGNORECASE),
    "scripts/": re.compile(r"\bscripts/", re.IGNORECASE),
    "issue #": re.compile(r"\bissue #", re.IGNORECASE),
    # a commit: 7 to 40 hex digits, with a digit and a letter, standing alone (not in a word, path or 0x...)
    "commit hash": re.compile(r"(?<![\w./#-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-]|\.\w)",
                              re.IGNORECASE),
    "TODO": re.compile(r"\bTODO\b"),
}
# alt text that only names the image's file: empty, a file name, a path or a content hash
FILE_NAME_ALT = re.compile(r"^\s*$|\.(png|svg|jpe?g|gif|webp)\b|_images/|\b[0-9a-f]{16,}\b", re.IGNORECASE)


def budget(page: str) -> int:
    """The rendered-height budget of a page (capstone chapters get a little more)."""
    return CAPSTONE_BUDGET if "capstone" in page else HEIGHT_BUDGET


def opened_budget(page: str) -> int:
    """The height budget of a page with every dropdown opened."""
    return CAPSTONE_OPENED_BUDGET if "capstone" in page else OPENED_BUDGET


def problems(report: dict) -> list[str]:
    """Everything a reader should not see (or a test should not allow) on a page, in words."""
    out = []
    if report["status"] != 200:
        out.append(f"status {report['status']}")
    out += [f"request to a non-local host: {u}" for u in report["external"]]
    out += [f"failed response: {r}" for r in report["failed_responses"]]
    out += [f"image did not load: {i['src']}" for i in report["images"] if not i["width"]]
    out += [f"math not rendered: {m}" for m in report["math_unrendered"]]
    out += [f"raw math left in the text: {m}" for m in report["raw_math"]]
    out += [f"error output: {e}" for e in report["errors"]]
    out += [f"script error: {e}" for e in report["js_errors"]]
    out += [f"truncated table cell: {c!r}" for c in report.get("truncated_cells", [])]
    out += [f"table cell without padding (numbers run together): {c!r}" for c in report.get("cramped_cells", [])[:5]]
    out += [f"raw Markdown in the prose: {m!r}" for m in report.get("raw_markdown", [])]
    out += [f"code wider than the page: {c!r}" for c in report.get("wide_code", [])]
    out += [f"equation clipped: {m!r}" for m in report.get("clipped_math", [])]
    out += [f"launch button to a placeholder repository: {u}" for u in report.get("launch_links", [])
            if "REPLACE-ME" in u]
    return out


# --------------------------------------------------------------------------- layout checks, page by page
# Each takes one page's report and returns its problems in words (an empty list for a good page).

def table_overflow(report: dict) -> list[str]:
    """Tables wider than the box they are seen through, where that box shows no horizontal scrollbar."""
    return [f"table {t['head']} ({t['columns']} columns, {t['where']}) is {t['width']} px wide in a "
            f"{t['box_width']} px box {t['box']} without a scrollbar"
            for t in report.get("tables", []) if t["overflows"] and not t["scrollbar"]]


def pandas_index(report: dict) -> list[str]:
    """Tables that show a DataFrame's index: a column under an empty header, of distinct integers."""
    return [f"table {t['head']} ({t['where']}): column {c['column']} has an empty header over the integers "
            f"{c['values']} (a pandas index left in)" for t in report.get("tables", []) for c in t["index_columns"]]


def page_width(report: dict) -> list[str]:
    """The page scrolls sideways in a WINDOW-wide window (as it opens, or with every dropdown open)."""
    return [f"{w['width']} px wide with dropdowns {state} (widest: {w['widest']})"
            for state, w in report.get("page_width", {}).items() if w["width"] > PAGE_WIDTH]


def figure_problems(report: dict) -> list[str]:
    """Images with no alt text but their file's name, or outside a figure with a visible caption."""
    out = []
    for f in report.get("figures", []):
        if f["alt"] is None or FILE_NAME_ALT.search(f["alt"]):
            out.append(f"image {f['src']} ({f['where']}) has alt text {f['alt']!r}, a file name, not a description")
        if not f["caption"]:
            where = "in a figure without a visible caption" if f["figure"] else "not in a figure"
            out.append(f"image {f['src']} ({f['where']}) is {where}")
    return out


def internal_wording(report: dict) -> list[str]:
    """Project-schedule wording (INTERNAL_WORDING) in the page's prose, each with its words around it."""
    out = []
    for where, text in report.get("prose", []):
        for name, pattern in INTERNAL_WORDING.items():
            for m in pattern.finditer(text):
                out.append(f"{name!r} in {where}: \"…{text[max(0, m.start() - 50):m.end() + 50]}…\"")
    return out


def gutter_problems(report: dict) -> list[str]:
    """Code with line numbers whose wrapped lines run back under the numbers' gutter."""
    return [f"{g['where']}: {len(g['under'])} of {g['lines']} lines wrap under the line numbers (gutter ends at "
            f"{g['gutter']} px; line, start: {', '.join(f'{ln} at {x} px' for ln, x in g['under'][:8])}"
            f"{', …' if len(g['under']) > 8 else ''})" for g in report.get("gutters", []) if g["under"]]


def each_page(rendered: dict, chapters_only: bool = False):
    """(page, report) for every rendered page (not the redirects nor the server's record)."""
    for page, r in rendered.items():
        if page != "_server" and "redirect" not in r and (page.startswith("notebooks/") or not chapters_only):
            yield page, r


def offenders(rendered: dict, check, chapters_only: bool = False) -> str:
    """Every page's problems under ``check``, one line each, or '' when there are none."""
    return "\n".join(f"{page}: {p}" for page, r in each_page(rendered, chapters_only) for p in check(r))


def pages(site: Path) -> list[Path]:

    """Every HTML page of the site (not the sources or static files)."""
    return sorted(p for p in site.rglob("*.html") if not {"_static", "_sources", "_images"} & set(p.parts))


REFRESH = re.compile(r"""<meta\s+http-equiv=["']refresh["']\s+content=["']\d+;\s*url=([^"']+)["']""", re.IGNORECASE)


def redirect_target(page: Path) -> str | None:
    """Where a redirect-only page (index.html → intro.html) sends the reader, or None for a real page."""
    text = page.read_text(errors="replace")
    m = REFRESH.search(text)
    return m.group(1) if m and len(text) < 2000 else None


def toc_pages() -> set[str]:
    """Every page _toc.yml puts in the book (root, chapters, reference pages), as built HTML paths."""
    import yaml

    from kernelbook.harness.paths import ROOT

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(toc.get("parts", []))
    walk(toc.get("chapters", []))
    return {f"{f.removesuffix('.md').removesuffix('.ipynb')}.html" for f in files}


class _Tables(html.parser.HTMLParser):
    """Every <table> of a page as rows of cells' text (whitespace collapsed)."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def html_tables(text: str) -> list[list[list[str]]]:
    """The tables of an HTML page, each a list of rows of cell texts (header row included)."""
    p = _Tables()
    p.feed(text)
    return p.tables


# ----------------------------------------------------------------------------------------------- tests

def screenshot_path(site: Path, page: str) -> Path:
    """Where the screenshot of ``page``'s first screen is kept: ``<build>/screenshots/``."""
    return site.parent / "screenshots" / (page.replace("/", "__").removesuffix(".html") + ".png")


def render_site(driver, site: Path) -> dict:
    """Every page of ``site`` opened in the browser: {relative path: report}; screenshots saved beside it.

    A page the browser cannot finish (a hang, a crash) becomes a report naming the failure, and the
    next page gets a fresh browser, so one bad page does not hide the state of the others.
    """
    out = {}
    exe = need_chromium()
    b = Browser(driver, exe)
    try:
        with serve(site) as (base, statuses):
            for page in pages(site):
                rel = page.relative_to(site).as_posix()
                target = redirect_target(page)
                if target is not None:  # rendering it would race its own redirect: check where it points
                    out[rel] = {"redirect": target, "target_exists": (page.parent / target).is_file()}
                    continue
                try:
                    out[rel] = b.open(f"{base}/{rel}")
                    b.screenshot(screenshot_path(site, rel))
                except Exception as e:  # reported as the page's problem below
                    out[rel] = {"status": None, "external": sorted(set(b.external)), "failed_responses": [],
                                "images": [], "math": 0, "math_unrendered": [], "raw_math": [], "js_errors": [],
                                "errors": [f"the browser could not render the page: {type(e).__name__}: {e}"]}
                    b.close()
                    b = Browser(driver, exe)
            out["_server"] = {"statuses": list(statuses)}
    finally:
        b.close()
    return out


# ----------------------------------------------------------------------------------------------- tests

@pytest.fixture(scope="session")
def driver():
    """Playwright's driver (one per session: the sync API allows one at a time), Chromium installed."""
    need_chromium()
    from playwright.sync_api import sync_playwright  # in requirements-dev.txt

    pw = sync_playwright().start()
    yield pw
    pw.stop()


@pytest.fixture(scope="module")
def browser(driver):
    b = Browser(driver, need_chromium())
    yield b
    b.close()


@pytest.fixture(scope="module", params=["toolkit", "no-toolkit"])
def site(request, tmp_path_factory) -> Path:
    """The built site: with the CUDA toolkit and CUDA PyTorch, and without either (Python alone)."""
    from test_book import build_site  # one build of each per test session, shared with test_book

    return build_site(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def rendered(driver, site):
    """Every page opened in the browser (see render_site)."""
    return render_site(driver, site)


@pytest.mark.book
def test_every_page_renders_cleanly_offline(rendered, site):
    redirects = {page: r for page, r in rendered.items() if "redirect" in r}
    assert all(r["target_exists"] for r in redirects.values()), f"redirects to missing pages: {redirects}"
    bad = {page: problems(r) for page, r in rendered.items()
           if page != "_server" and page not in redirects and problems(r)}
    assert not bad, "pages a reader would see broken:\n" + "\n".join(f"{p}: {v}" for p, v in bad.items())
    expected = toc_pages()  # every page of the table of contents: each chapter, the intro, the reference pages
    assert {"intro.html", "notebooks/00_method.html", "references.html"} <= expected
    assert expected <= set(rendered), f"pages missing from the site: {expected - set(rendered)}"
    # the browser asks for /favicon.ico by itself; the site has none, and no page refers to one
    not_ok = [(p, s) for p, s in rendered["_server"]["statuses"] if s >= 400 and p != "/favicon.ico"]
    assert not not_ok, f"the server answered errors: {not_ok}"


@pytest.mark.book
def test_math_is_rendered_by_the_sites_own_mathjax(rendered):
    with_math = {p: r for p, r in rendered.items() if r.get("math")}
    assert with_math, "no page has math: the check below would prove nothing"
    for page, r in with_math.items():
        assert r["mathjax_loaded"] and not r["math_unrendered"], page
        assert any("/_static/mathjax/" in u for u in r["requested"]), f"{page}: MathJax not from the site"


@pytest.mark.book
def test_chapters_have_images_and_screenshots(rendered, site):
    chapters = [p for p in rendered if p.startswith("notebooks/")]
    assert chapters
    for page in chapters:
        assert rendered[page]["images"], f"{page} shows no figure"
        shot = screenshot_path(site, page)
        assert shot.is_file() and shot.stat().st_size > 10_000, f"no screenshot of {page}"


def _cell(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


@pytest.mark.book
def test_intro_table_matches_the_records(site):
    """The rendered table, parsed row by row: every cell is kernelbook.summary's number from the records
    (test_summary checks those numbers against the records' medians and floors)."""
    from kernelbook import summary

    tables = [t for t in html_tables((site / "intro.html").read_text()) if t and t[0] == summary.COLUMNS]
    assert len(tables) == 1, "the intro shows no results table (or more than one)"
    shown = tables[0][1:]
    expected = [[r["problem"], r["operation"].replace("`", ""), r["chapter"][:2], _cell(r["eager ms"], ".3f"),
                 _cell(r["compile ms"], ".3f"), _cell(r["ours ms"], ".3f"), _cell(r["× eager"], ".2f"),
                 _cell(r["× compile"], ".2f"), _cell(r["% of floor"], ".0f")] for r in summary.rows()]
    assert expected, "no chapter has a record: the table would prove nothing"
    assert shown == expected


def test_tables_are_parsed_cell_by_cell():
    page = ("<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td><a href='x'><span>00</span></a>"
            "</td><td><code>· 2.0</code> alone,\n 1 GiB</td></tr></tbody></table><p>not a cell</p>")
    assert html_tables(page) == [[["a", "b"], ["00", "· 2.0 alone, 1 GiB"]]]


def test_every_chapter_in_the_toc_is_required():
    pages = toc_pages()
    chapters = {p.stem for p in (Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    toc = (Path(__file__).resolve().parents[1] / "_toc.yml").read_text()
    for c in chapters:
        if f"notebooks/{c}" in toc:
            assert f"notebooks/{c}.html" in pages, c
    assert "intro.html" in pages and "pitfalls.html" in pages


@pytest.mark.book
def test_search_works_offline(site, browser):
    with serve(site) as (base, _):
        browser.open(f"{base}/search.html?q=warp")
        hits = browser.evaluate("""async () => {
            for (let i = 0; i < 100; i++) {
              const n = document.querySelectorAll('#search-results li').length;
              if (n) return n;
              await new Promise(r => setTimeout(r, 100));
            }
            return 0; }""")
    assert hits > 0, "the site's search found nothing for 'warp'"


def test_a_request_to_another_host_fails_the_check(tmp_path, driver):
    """The check is not vacuous: a page that pulls a script, a font and an image from elsewhere (and opens a
    websocket there) fails it, and nothing reaches those hosts (requests are refused in the browser)."""
    (tmp_path / "page.html").write_text(
        "<!doctype html><html><head>"
        '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>'
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Lato">'
        '</head><body><p>Inline math $x^2$ left raw.</p><img src="http://example.com/plot.png">'
        '<img src="local.png"><script>new WebSocket("wss://example.com/socket")</script></body></html>')
    (tmp_path / "local.png").write_bytes(base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="))
    b = Browser(driver, need_chromium())
    try:
        with serve(tmp_path) as (base, _):
            report = b.open(f"{base}/page.html")
    finally:
        b.close()
    found = problems(report)
    assert {"https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js", "http://example.com/plot.png",
            "wss://example.com/socket"} <= set(report["external"]), report["external"]
    assert any(f.startswith("request to a non-local host") for f in found)
    assert any(f.startswith("image did not load: http://example.com/") for f in found)
    assert not any("local.png" in f for f in found), "the local image loaded"
    assert any(f.startswith("raw math left") for f in found)


def test_local_and_external_urls():
    assert is_local("http://127.0.0.1:8000/intro.html") and is_local("data:image/png;base64,xx")
    assert is_local("http://localhost:1/x") and is_local("about:blank")
    assert not is_local("https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js")
    assert not is_local("http://10.0.0.1/x") and not is_local("https://fonts.gstatic.com/s/lato.woff2")


@pytest.mark.book
def test_no_page_links_a_script_stylesheet_or_font_from_another_host(site):
    """A static check beside the browser's: nothing the page loads by itself is addressed off-site."""
    tag = re.compile(r"""<(?:script[^>]*\ssrc|link[^>]*\shref)=["'](https?:)?//""", re.IGNORECASE)
    bad = [p.relative_to(site).as_posix() for p in pages(site) if tag.search(p.read_text())]
    assert not bad, f"pages that load a script or stylesheet from another host: {bad}"


@pytest.mark.book
def test_every_chapter_has_a_download_and_a_launch_button_only_with_a_real_address(site):
    """Every chapter offers its stored notebook; a Colab button appears only on chapter pages, and only
    when repository.url is a real address (with the placeholder it could only lead nowhere)."""
    import yaml

    from kernelbook.harness.paths import ROOT

    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    placeholder = "REPLACE-ME" in repo["url"]
    chapters = sorted((site / "notebooks").glob("*.html"))
    assert chapters
    for page in chapters:
        html = page.read_text()
        assert f'href="../_sources/notebooks/{page.stem}.ipynb"' in html, f"{page.name}: no download button"
        stored = json.loads((site / "_sources" / "notebooks" / f"{page.stem}.ipynb").read_text())
        assert all(c.get("outputs", []) == [] for c in stored["cells"]), "the download is the stored notebook"
        gh = repo["url"].removeprefix("https://github.com/")
        colab = f"https://colab.research.google.com/github/{gh}/blob/{repo['branch']}/notebooks/{page.stem}.ipynb"
        if placeholder:
            assert "colab.research.google.com/github" not in html, f"{page.name}: a Colab button to a placeholder"
        else:
            assert colab in html, f"{page.name}: no Colab button for {colab}"
    for page in pages(site):
        if not page.relative_to(site).as_posix().startswith("notebooks/"):
            assert "colab.research.google.com/github" not in page.read_text(), f"{page.name}: a launch button"


@pytest.mark.book
def test_every_page_fits_its_height_budget(rendered):
    """A chapter reads in one sitting: its height at 1280 px wide, dropdowns closed, within budget."""
    over = {p: r["height"] for p, r in rendered.items() if "height" in r and r["height"] > budget(p)}
    assert not over, f"pages taller than their budget ({HEIGHT_BUDGET:,} px, capstones {CAPSTONE_BUDGET:,}): {over}"


@pytest.mark.book
def test_every_page_fits_its_height_budget_with_every_dropdown_open(rendered):
    """A reader who opens every dropdown, code toggle and hidden output still gets a bounded page."""
    over = "\n".join(f"{p}: {r['height_opened']:,} px (budget {opened_budget(p):,})" for p, r in each_page(rendered)
                     if "height_opened" in r and r["height_opened"] > opened_budget(p))
    assert not over, (f"pages taller than their budget with every dropdown open ({OPENED_BUDGET:,} px, capstones "
                      f"{CAPSTONE_OPENED_BUDGET:,}):\n{over}")


@pytest.mark.book
def test_no_page_is_wider_than_the_window(rendered):
    """Nothing makes a page scroll sideways at 1280 px, dropdowns closed or open."""
    bad = offenders(rendered, page_width)
    assert not bad, f"pages wider than the {PAGE_WIDTH} px window:\n{bad}"


@pytest.mark.book
def test_no_table_overflows_its_box(rendered):
    """Every table (those in dropdowns too, opened) fits the box it is seen through, or that box scrolls."""
    bad = offenders(rendered, table_overflow)
    assert not bad, f"tables wider than their box, with no scrollbar to reach the rest:\n{bad}"


@pytest.mark.book
def test_no_table_shows_a_pandas_index(rendered):
    """A DataFrame's row numbers are no information: a table does not show them as a column."""
    bad = offenders(rendered, pandas_index)
    assert not bad, f"tables showing a leftover pandas index:\n{bad}"


@pytest.mark.book
def test_every_figure_has_alt_text_and_a_caption(rendered):
    """Every image of a chapter says what it shows (alt text) and sits in a figure with a visible caption."""
    bad = offenders(rendered, figure_problems, chapters_only=True)
    assert not bad, f"figures without a description or a caption:\n{bad}"


@pytest.mark.book
def test_no_internal_wording_in_the_prose(rendered):
    """The prose is written for the reader: no project-schedule wording (INTERNAL_WORDING)."""
    bad = offenders(rendered, internal_wording)
    assert not bad, f"project-schedule wording in the prose:\n{bad}"


@pytest.mark.book
def test_wrapped_code_lines_stay_clear_of_the_line_numbers(rendered):
    """A long code line that wraps continues right of the line numbers, not under them."""
    bad = offenders(rendered, gutter_problems)
    assert not bad, f"code whose wrapped lines run under the line numbers:\n{bad}"


LAYOUT_SAMPLE = """<!doctype html><html><head><style>
  body { margin: 0; } article { width: 700px; margin-left: 40px; }
  .scroll { overflow-x: auto; } pre { white-space: pre-wrap; width: 300px; font: 12px monospace; }
  .linenos { margin-right: 1em; }
</style></head><body><article>
<section id="good">
  <h2>Good</h2><p>Prose without schedule words: a kernel at 0xdeadbeef7 and 16777216 floats.</p>
  <figure><img src="plot.png" alt="Time against size, two curves"><figcaption>Time against size.</figcaption></figure>
  <div class="scroll"><table><tr><th>wide</th></tr><tr><td style="min-width: 900px">scrolls</td></tr></table></div>
  <table><thead><tr><th></th><th>value</th></tr></thead><tbody><tr><th>eval</th><td>1</td></tr></tbody></table>
  <pre><span class="linenos">1</span>short line</pre>
</section>
<section id="bad">
  <h2>Bad</h2><p>We missed our target; see notes/plan.md, issue #12 and commit 3fa9c21e. TODO: shorten.</p>
  <img src="../_images/0123456789abcdef0123.png" alt="../_images/0123456789abcdef0123.png">
  <table><thead><tr><th>spills</th></tr></thead><tbody><tr><td style="min-width: 900px">x</td></tr></tbody></table>
  <table><thead><tr><th></th><th>ms</th></tr></thead><tbody><tr><th>2</th><td>0.1</td></tr>
    <tr><th>0</th><td>0.2</td></tr><tr><th>1</th><td>0.3</td></tr></tbody></table>
  <details><summary>More</summary><div style="height: 40000px"></div>
    <pre><span class="linenos">7</span>a_long_identifier_that_wraps + another_long_identifier_that_wraps_too</pre>
    <div style="width: 1500px">wide</div></details>
</section></article></body></html>"""


def test_the_layout_checks_find_what_they_name(tmp_path, driver):
    """Each layout check, on a page built to fail it in one section and pass it in the other, names only the
    bad section's elements (the checks are not vacuous, and do not flag what is fine)."""
    (tmp_path / "page.html").write_text(LAYOUT_SAMPLE)
    (tmp_path / "plot.png").write_bytes(base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="))
    (tmp_path / "0123456789abcdef0123.png").write_bytes((tmp_path / "plot.png").read_bytes())
    b = Browser(driver, need_chromium())
    try:
        with serve(tmp_path) as (base, _):
            r = b.open(f"{base}/page.html")
    finally:
        b.close()
    assert r["height"] < 2000 < 40_000 < r["height_opened"], (r["height"], r["height_opened"])
    assert r["page_width"]["closed"]["width"] <= PAGE_WIDTH < r["page_width"]["opened"]["width"]
    assert page_width(r) and all("dropdowns opened" in p and "#bad" in p for p in page_width(r)), page_width(r)
    for check, n in [(table_overflow, 1), (pandas_index, 1), (figure_problems, 2), (gutter_problems, 1)]:
        found = check(r)
        assert len(found) == n and all("#bad" in f or "More" in f for f in found), (check.__name__, found)
    assert "column 1" in pandas_index(r)[0] and "['2', '0', '1']" in pandas_index(r)[0]
    assert "7 at" in gutter_problems(r)[0]
    words = internal_wording(r)
    assert sorted(w.split(" in ")[0] for w in words) == sorted(repr(k) for k in
        ["missed", "our target", "notes/", "issue #", "commit hash", "TODO"]), words
    assert all("#bad" in w for w in words) and "3fa9c21e" in " ".join(words)
