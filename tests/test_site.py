"""The built site, opened page by page in headless Chromium, as a reader's browser would show it.

The book is built once (test_book's build), served on 127.0.0.1, and every page is loaded in Debian's
Chromium, driven by Playwright (``executable_path``: Playwright's own browsers are never downloaded).
Each page must answer 200, show no error output, load every image, leave no raw ``$…$`` math behind
(MathJax, served by the site itself, rendered it) and make no request to any host but the local
server: every request is intercepted, and one to any other host is refused before it leaves the
machine and fails the test. A screenshot of each page's first screen is kept beside the built site
(``<build>/screenshots/``) for a human to look at.

Then, with every dropdown and hidden cell opened, the layout a reader meets at 1280 px wide: no table
wider than its box and none showing pandas' unnamed index, no page wider than the window, heights
within budget (closed and opened), every image a captioned figure with a description, no wording
from the working notes in the prose, no code wrapped under its line numbers. One page script
(PAGE_REPORT) measures it all; problems() alone turns its report into complaints.
"""

from __future__ import annotations

import base64
import functools
import html.parser
import http.server
import json
import math
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

class _Playwright:
    """One Playwright driver for the whole process, shared by every Browser (the sync API allows one per
    thread) and stopped when the last Browser closes."""

    driver = None
    users = 0

    @classmethod
    def acquire(cls):
        from playwright.sync_api import sync_playwright  # playwright, in requirements-dev.txt

        if cls.driver is None:
            cls.driver = sync_playwright().start()
        cls.users += 1
        return cls.driver

    @classmethod
    def release(cls) -> None:
        cls.users -= 1
        if cls.users <= 0 and cls.driver is not None:
            cls.driver.stop()
            cls.driver, cls.users = None, 0


class Browser:
    """Debian's headless Chromium with one page, driven by Playwright (sync API, ``executable_path``: no
    browser of Playwright's own is downloaded or used).

    Every request the page makes is routed: local ones continue, any other is aborted before it is sent
    and recorded in ``external``. Chromium's own resolver also maps every host but localhost to 'not
    found', so nothing leaves the machine even for requests the page does not make (a WebSocket, a
    prefetch), and service workers are blocked so that none can fetch behind the route.
    """

    def __init__(self, exe: str, width: int = 1280, height: int = 900):
        self.width, self.height = width, height
        self.external: list[str] = []
        self._requested: list[str] = []
        self._responses: list[tuple[str, int]] = []
        self._js_errors: list[str] = []
        pw = _Playwright.acquire()
        try:
            self.browser = pw.chromium.launch(
                executable_path=exe, headless=True,
                args=["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                      "--disable-component-update", "--disable-sync", "--disable-extensions",
                      "--disable-default-apps", "--dns-prefetch-disable",
                      "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1"])
            self.context = self.browser.new_context(viewport={"width": width, "height": height},
                                                    device_scale_factor=1, service_workers="block")
            self.page = self.context.new_page()
        except Exception:
            _Playwright.release()
            raise
        self.page.set_default_timeout(120_000)
        self.page.route("**/*", self._route)
        self.page.on("request", lambda r: self._requested.append(r.url))
        self.page.on("response", lambda r: self._responses.append((r.url, r.status)))
        self.page.on("pageerror", lambda e: self._js_errors.append(str(e)))
        self._closed = False

    def _route(self, route) -> None:
        url = route.request.url
        if is_local(url):
            route.continue_()
        else:
            self.external.append(url)
            route.abort("blockedbyclient")

    def evaluate(self, expression: str, arg=None):
        """The value of a page script (an expression, or a function called with ``arg``)."""
        return self.page.evaluate(expression, arg)

    # -- pages
    def open(self, url: str) -> dict:
        """Load ``url`` and return what a reader would see (see PAGE_REPORT), plus status and requests."""
        self.external.clear()
        self._requested.clear()
        self._responses.clear()
        self._js_errors.clear()
        response = self.page.goto(url, wait_until="load")
        report = self.page.evaluate(PAGE_REPORT, {"wording": [[label, pattern, flags] for label, pattern, flags
                                                              in INTERNAL_WORDING]})
        report["page"] = urlsplit(url).path.lstrip("/")
        report["viewport_width"] = self.width
        report["status"] = response.status if response is not None else None
        report["failed_responses"] = [f"{s} {u}" for u, s in self._responses if s >= 400]
        report["requested"] = list(self._requested)
        report["external"] = sorted(set(self.external) | {u for u in report["requested"] if not is_local(u)})
        report["js_errors"] = list(self._js_errors)
        return report

    def screenshot(self, path: Path, clip: dict | None = None) -> None:
        """The first screen as a PNG, or ``clip`` ({x, y, width, height} in CSS px of the whole page, any
        part of it; an optional ``scale`` shrinks the picture).

        A clip is shot as a reader sees it: the window made as tall as the clip, scrolled to it, and
        that screen taken (Chromium's capture beyond the viewport lays some pages out anew, wider and
        shifted, so a full-page capture does not show the page the checks measured).
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        if clip is None:
            self.page.screenshot(path=str(path))
            return
        tall = max(self.height, math.ceil(clip["height"]))
        self.page.set_viewport_size({"width": self.width, "height": tall})
        try:
            top = self.page.evaluate("y => { window.scrollTo(0, y); return window.scrollY; }", clip["y"])
            self.page.wait_for_timeout(100)  # let sticky headers and lazy content settle after the scroll
            box = {"x": clip["x"], "y": clip["y"] - top, "width": clip["width"], "height": clip["height"]}
            self.page.screenshot(path=str(path), clip=box)
        finally:
            self.page.set_viewport_size({"width": self.width, "height": self.height})
            self.page.evaluate("() => window.scrollTo(0, 0)")
        scale = clip.get("scale", 1)
        if scale != 1:
            from PIL import Image  # pillow, which matplotlib needs

            with Image.open(path) as im:
                small = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))))
            small.save(path)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.browser.close()
        finally:
            _Playwright.release()


# Words of the book's working notes that a reader should never meet in the prose (article text outside
# pre, code and the cells' input): planning language ("our target", "missed"), pointers into the
# repository's own files and issue tracker, and commit hashes. Each is (what it is, JS regex, flags);
# the hash pattern is case-sensitive: a standalone 7-12 character lowercase hex word with at least one
# digit and one letter ("28c239f"), which plain words ("deadbeef" has no digit) and numbers never are.
INTERNAL_WORDING = [
    ("planning language", r"\bour target\b|\btarget for this chapter\b|\bwhat would come next\b", "gi"),
    ("planning language", r"(^|\s)missed\b", "gi"),
    ("a repository path", r"\bnotes/|\bscripts/", "gi"),
    ("an issue reference", r"\bissue #", "gi"),
    ("review language", r"\breviewer", "gi"),
    ("a commit hash", r"(?<![\w/.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}(?![\w/-])", "g"),
]


# What a page shows once it has settled: MathJax done, images loaded or failed; then, with every
# dropdown and hidden cell opened, the layout checks (tables, page width, figures, wording, gutters).
PAGE_REPORT = r"""
async (cfg) => {
  const settle = (ms) => new Promise(r => setTimeout(r, ms));
  // index.html redirects to intro.html: wait for whichever document ends up shown
  for (let i = 0; i < 100 && !(document.body && document.readyState === 'complete'); i++) await settle(50);
  const mjScript = document.querySelector('script[src*="mathjax"]');
  const math = Array.from(document.querySelectorAll('.math'));
  if (mjScript && math.length) {
    for (let i = 0; i < 200 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++) await settle(50);
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  }
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.race([settle(60000),
    Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })))]);
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
  const prose = document.createTreeWalker(document.querySelector('article') || document.body, NodeFilter.SHOW_TEXT);
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
  const articleRight = (document.querySelector('article') || document.body).getBoundingClientRect().right;
  const clippedMath = Array.from(document.querySelectorAll('article mjx-container[display="true"]'))
    .filter(visible).filter(m => m.scrollWidth > m.clientWidth + 2 ||
      (m.firstElementChild && m.firstElementChild.getBoundingClientRect().right > articleRight + 2))
    .map(m => m.textContent.slice(0, 60));
  const launch = Array.from(document.querySelectorAll('a[href]')).map(a => a.href)
    .filter(h => /colab\.research|mybinder|REPLACE-ME/i.test(h));
  const pageHeight = () => Math.max(document.documentElement.scrollHeight, document.body.scrollHeight);
  const closedHeight = pageHeight();

  // ---- everything opened: sphinx-design / kernelbook dropdowns and myst-nb's hide-input and
  // hide-output toggles are <details>; sphinx-togglebutton hides with .toggle-hidden
  const closedDetails = Array.from(document.querySelectorAll('details')).filter(d => !d.open);
  closedDetails.forEach(d => { d.open = true; });
  const hiddenToggles = Array.from(document.querySelectorAll('.toggle-hidden'));
  hiddenToggles.forEach(e => e.classList.remove('toggle-hidden'));
  const hiddenButtons = Array.from(document.querySelectorAll('.toggle-button-hidden'));
  hiddenButtons.forEach(e => e.classList.remove('toggle-button-hidden'));
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  await settle(50);
  const openHeight = pageHeight();

  const article = document.querySelector('article') || document.body;
  const aRect = article.getBoundingClientRect();
  const snippet = (s, n = 60) => s.replace(/\s+/g, ' ').trim().slice(0, n);
  // where an element sits, for the reader of the complaint: its section's heading and id
  const where = (el) => {
    const sec = el.closest('section[id]');
    if (!sec) return 'before the first section';
    const h = sec.querySelector('h1, h2, h3, h4, h5, h6');
    return `§ "${h ? snippet(h.textContent.replace(/[#¶]\s*$/, ''), 50) : ''}" (#${sec.id})`;
  };
  const clips = (el) => getComputedStyle(el).overflowX !== 'visible';
  // the title a reader sees above an element: its <caption>, kernelbook's caption or its dropdown's summary
  const title = (el) => {
    if (el.caption && el.caption.textContent.trim()) return snippet(el.caption.textContent, 70);
    for (let e = el; e && e !== article; e = e.parentElement) {
      const s = e.previousElementSibling;
      if (s && s.matches('.kb-caption, summary')) return snippet(s.textContent, 70);
      if (e.matches('.cell_output, section')) break;
    }
    return '';
  };

  // 1. tables: content wider than the box that shows it, and pandas' unnamed index column
  const tableOverflow = [], indexTables = [];
  Array.from(article.querySelectorAll('table')).forEach((t, i) => {
    if (!visible(t)) return;
    const caption = title(t);
    const head = Array.from((t.tHead && t.tHead.rows[0] || t.rows[0] || {cells: []}).cells)
      .slice(0, 4).map(c => snippet(c.textContent, 20));
    const name = `table ${i + 1} ${caption ? '"' + caption + '" ' : ''}[${head.join(' | ')}] in ${where(t)}`;
    let box = null;
    for (let a = t.parentElement; a && a !== document.body && a !== document.documentElement; a = a.parentElement) {
      if (clips(a)) { box = a; break; }
    }
    const r = t.getBoundingClientRect();
    let limit = aRect.right, limitName = 'the article';
    if (box) {
      const br = box.getBoundingClientRect();
      const right = br.left + box.clientLeft + box.clientWidth;
      if (right < limit) { limit = right; limitName = 'its scrolling box'; }
    }
    const cellRight = Math.max(r.right, ...Array.from(t.querySelectorAll('td, th'))
      .map(c => c.getBoundingClientRect().right));
    const contentRight = Math.max(r.left + t.scrollWidth, cellRight);
    if (contentRight > limit + 1 || t.scrollWidth > t.clientWidth + 1)
      tableOverflow.push({table: name, content: Math.round(contentRight - r.left),
                          shown: Math.round(Math.min(limit, r.left + t.clientWidth) - r.left), box: limitName});
    const headRows = t.tHead ? Array.from(t.tHead.rows) : [];
    const bodyRows = Array.from(t.tBodies).flatMap(b => Array.from(b.rows));
    if (headRows.length && bodyRows.length
        && headRows.every(row => row.cells.length && !row.cells[0].textContent.trim())
        && bodyRows.every(row => row.cells.length && row.cells[0].tagName === 'TH'))
      indexTables.push({table: name, first: snippet(bodyRows[0].cells[0].textContent, 20)});
  });

  // 2. page width: wider than the window means a sideways scroll of the whole page
  const pageWidth = document.documentElement.scrollWidth;
  let widest = null;
  if (pageWidth > window.innerWidth) {
    // the element whose right edge is largest, not counting what a clipping or scrolling box hides
    let best = null, bestRight = -Infinity;
    const visit = (el) => {
      const r = el.getBoundingClientRect();
      if ((r.width || r.height) && r.right > bestRight) { best = el; bestRight = r.right; }
      if (el !== document.body && clips(el)) return;
      for (const c of el.children) visit(c);
    };
    for (const c of document.body.children) visit(c);
    if (best) widest = {element: best.tagName.toLowerCase() + (best.className && typeof best.className === 'string'
                          ? '.' + best.className.trim().split(/\s+/).join('.') : ''),
                        right: Math.round(bestRight + window.scrollX), text: snippet(best.textContent, 80),
                        where: where(best)};
  }

  // 4. figures: in a <figure> with a caption, with alt text that describes the image
  const figures = [];
  for (const img of article.querySelectorAll('img')) {
    const fig = img.closest('figure');
    const cap = fig && fig.querySelector('figcaption');
    const alt = (img.getAttribute('alt') || '').trim();
    const why = [];
    if (!fig) why.push('not in a <figure>');
    else if (!cap || !cap.textContent.trim()) why.push('no caption');
    if (!alt) why.push('no alt text');
    else if (/\.(png|svg|jpe?g|gif|webp|pdf)\b/i.test(alt)) why.push(`alt text is a file name (${snippet(alt, 40)})`);
    else if (/^[0-9a-f]{6,}$/i.test(alt) || /[0-9a-f]{16,}/i.test(alt))
      why.push(`alt text is a hash (${snippet(alt, 40)})`);
    else if (alt.split(/\s+/).length < 3) why.push(`alt text is not a description (${snippet(alt, 40)})`);
    if (why.length) figures.push({image: (img.getAttribute('src') || '').split('/').pop(),
                                  where: where(img), why: why});
  }

  // 5. internal wording in the prose: text grouped by its block element, code and cell input left out
  const noProse = 'pre, code, .cell_input, script, style, textarea, mjx-container, .math';
  const blockOf = (el) => {
    for (let e = el; e && e !== article; e = e.parentElement) {
      const d = getComputedStyle(e).display;
      if (!d.startsWith('inline') && d !== 'contents') return e;
    }
    return article;
  };
  const blocks = new Map();
  const words = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let n = words.nextNode(); n; n = words.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(noProse) || !visible(el)) continue;
    const b = blockOf(el);
    blocks.set(b, (blocks.get(b) || '') + n.textContent);
  }
  const wording = [];
  for (const [b, s] of blocks) {
    const flat = s.replace(/\s+/g, ' ');
    for (const [label, pattern, flags] of cfg.wording) {
      for (const m of flat.matchAll(new RegExp(pattern, flags))) {
        const at = m.index + (m[0].length - m[0].trimStart().length);
        wording.push({kind: label, match: m[0].trim(), where: where(b),
                      text: snippet(flat.slice(Math.max(0, at - 40), at + m[0].trim().length + 40), 100)});
      }
    }
  }

  // 6. line-number gutters (see test_line_numbers_keep_their_gutter)
  const gutter = [];
  for (const pre of article.querySelectorAll('pre')) {
    if (!visible(pre)) continue;
    const nums = Array.from(pre.querySelectorAll('span.linenos'));
    for (let i = 0; i < nums.length; i++) {
      const codeLeft = nums[i].getBoundingClientRect().right;
      const range = document.createRange();
      range.setStartAfter(nums[i]);
      if (i + 1 < nums.length) range.setEndBefore(nums[i + 1]); else range.setEnd(pre, pre.childNodes.length);
      const under = Array.from(range.getClientRects()).some(q => q.width >= 1 && q.left < codeLeft - 1);
      if (under) {
        gutter.push({line: nums[i].textContent.trim(), text: snippet(range.toString(), 60), where: where(pre),
                     lines: nums.length, title: title(pre)});
        break;  // one per block
      }
    }
  }
  for (const t of article.querySelectorAll('table.highlighttable')) {
    const nums = t.querySelector('td.linenos pre'), code = t.querySelector('td.code pre');
    if (!nums || !code || !visible(code)) continue;
    const lh = parseFloat(getComputedStyle(code).lineHeight) || 16;
    if (code.getBoundingClientRect().height > nums.getBoundingClientRect().height + lh / 2)
      gutter.push({line: '', text: snippet(code.textContent, 60), where: where(t),
                   lines: nums.textContent.trim().split('\n').length, title: title(t)});
  }

  // ---- back as the reader first sees the page (the screenshot is of the closed page)
  closedDetails.forEach(d => { d.open = false; });
  hiddenToggles.forEach(e => e.classList.add('toggle-hidden'));
  hiddenButtons.forEach(e => e.classList.add('toggle-button-hidden'));
  window.scrollTo(0, 0);
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));

  return {
    height: closedHeight,
    open_height: openHeight,
    opened: closedDetails.length + hiddenToggles.length,
    truncated_cells: truncated,
    cramped_cells: cramped,
    raw_markdown: rawMd,
    wide_code: wide,
    clipped_math: clippedMath,
    launch_links: launch,
    table_overflow: tableOverflow,
    index_tables: indexTables,
    page_width: pageWidth,
    widest: widest,
    figures: figures,
    wording: wording,
    gutter: gutter,
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
OPEN_BUDGET = 32_000  # every dropdown and hidden cell opened: what a reader who opens them all scrolls through
CAPSTONE_OPEN_BUDGET = 40_000
PAGE_WIDTH = 1280  # the viewport the pages are checked at; no page may scroll sideways in it


def budget(page: str, opened: bool = False) -> int:
    """The rendered-height budget of a page (capstone chapters get a little more), closed or opened."""
    if opened:
        return CAPSTONE_OPEN_BUDGET if "capstone" in page else OPEN_BUDGET
    return CAPSTONE_BUDGET if "capstone" in page else HEIGHT_BUDGET


# The kinds of complaint problems() makes, each asserted by its own test.
KINDS = ("render", "table", "width", "height", "figure", "wording", "gutter")


def complaints(report: dict) -> list[tuple[str, str]]:
    """Everything a reader should not see on a page, as (kind, words): kind is one of KINDS."""
    out = []

    def add(kind, items):
        out.extend((kind, i) for i in items)

    if report["status"] != 200:
        add("render", [f"status {report['status']}"])
    add("render", [f"request to a non-local host: {u}" for u in report["external"]])
    add("render", [f"failed response: {r}" for r in report["failed_responses"]])
    add("render", [f"image did not load: {i['src']}" for i in report["images"] if not i["width"]])
    add("render", [f"math not rendered: {m}" for m in report["math_unrendered"]])
    add("render", [f"raw math left in the text: {m}" for m in report["raw_math"]])
    add("render", [f"error output: {e}" for e in report["errors"]])
    add("render", [f"script error: {e}" for e in report["js_errors"]])
    add("render", [f"truncated table cell: {c!r}" for c in report.get("truncated_cells", [])])
    add("render", [f"table cell without padding (numbers run together): {c!r}"
                   for c in report.get("cramped_cells", [])[:5]])
    add("render", [f"raw Markdown in the prose: {m!r}" for m in report.get("raw_markdown", [])])
    add("render", [f"code wider than the page: {c!r}" for c in report.get("wide_code", [])])
    add("render", [f"equation clipped: {m!r}" for m in report.get("clipped_math", [])])
    add("render", [f"launch button to a placeholder repository: {u}" for u in report.get("launch_links", [])
                   if "REPLACE-ME" in u])
    add("table", [f"table wider than its box: {t['table']} ({t['content']} px of content, {t['shown']} px shown"
                  f" by {t['box']})" for t in report.get("table_overflow", [])])
    add("table", [f"pandas index column left in: {t['table']} (rows start with {t['first']!r} under an empty header)"
                  for t in report.get("index_tables", [])])
    width = report.get("page_width")
    if width is not None and width > report.get("viewport_width", PAGE_WIDTH):
        w = report.get("widest") or {}
        add("width", [f"page {width} px wide at a {report.get('viewport_width', PAGE_WIDTH)} px window; widest: "
                      f"<{w.get('element')}> reaching {w.get('right')} px in {w.get('where')}: {w.get('text')!r}"])
    page = report.get("page", "")
    if "height" in report and report["height"] > budget(page):
        add("height", [f"{report['height']:,} px tall with dropdowns closed (budget {budget(page):,})"])
    if "open_height" in report and report["open_height"] > budget(page, opened=True):
        add("height", [f"{report['open_height']:,} px tall with every dropdown open "
                       f"(budget {budget(page, opened=True):,})"])
    add("figure", [f"image {f['image']} in {f['where']}: {', '.join(f['why'])}" for f in report.get("figures", [])])
    add("wording", [f"internal wording ({w['kind']}: {w['match']!r}) in {w['where']}: {w['text']!r}"
                    for w in report.get("wording", [])])
    add("gutter", [f"code runs under its line numbers: {(repr(g['title']) + ' ') if g.get('title') else ''}in "
                   f"{g['where']} (line {g['line']} of {g['lines']}: {g['text']!r})" for g in report.get("gutter", [])])
    return out


def problems(report: dict, kinds: tuple[str, ...] | set[str] | None = None) -> list[str]:
    """Everything a reader should not see (or a test should not allow) on a page, in words; only the
    complaints of ``kinds`` (see KINDS) if given."""
    return [text for kind, text in complaints(report) if kinds is None or kind in kinds]


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

@pytest.fixture(scope="module")
def browser():
    b = Browser(need_chromium())
    yield b
    b.close()


@pytest.fixture(scope="module", params=["toolkit", "no-toolkit"])
def site(request, tmp_path_factory) -> Path:
    """The built site: with the CUDA toolkit and CUDA PyTorch, and without either (Python alone)."""
    from test_book import build_site  # one build of each per test session, shared with test_book

    return build_site(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def rendered(site):
    """Every page opened in the browser: {relative path: report}; screenshots saved beside the site.

    A page the browser cannot finish (a hang, a crash) becomes a report naming the failure, and the
    next page gets a fresh browser, so one bad page does not hide the state of the others.
    """
    shots = site.parent / "screenshots"
    out = {}
    exe = need_chromium()
    b = Browser(exe)
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
                    b.screenshot(shots / (rel.replace("/", "__").removesuffix(".html") + ".png"))
                except Exception as e:  # reported as the page's problem below
                    out[rel] = {"page": rel, "status": None, "external": sorted(set(b.external)),
                                "failed_responses": [],
                                "images": [], "math": 0, "math_unrendered": [], "raw_math": [], "js_errors": [],
                                "errors": [f"the browser could not render the page: {type(e).__name__}: {e}"]}
                    b.close()
                    b = Browser(exe)
            out["_server"] = {"statuses": list(statuses)}
    finally:
        b.close()
    return out


@pytest.mark.book
def test_every_page_renders_cleanly_offline(rendered, site):
    redirects = {page: r for page, r in rendered.items() if "redirect" in r}
    assert all(r["target_exists"] for r in redirects.values()), f"redirects to missing pages: {redirects}"
    bad = {page: problems(r, {"render"}) for page, r in rendered.items()
           if page != "_server" and page not in redirects and problems(r, {"render"})}
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
        shot = site.parent / "screenshots" / (page.replace("/", "__").removesuffix(".html") + ".png")
        assert shot.is_file() and shot.stat().st_size > 10_000, f"no screenshot of {page}"


@pytest.mark.book
def test_intro_table_matches_the_records(site):
    """The rendered table, parsed row by row: every cell is kernelbook.summary's number from the records
    (test_summary checks those numbers against the records' medians and floors)."""
    from kernelbook import summary

    rs = summary.rows()
    cols = summary.columns(rs)
    tables = [t for t in html_tables((site / "intro.html").read_text()) if t and t[0] == cols]
    assert len(tables) == 1, "the intro shows no results table (or more than one)"
    shown = tables[0][1:]
    expected = [[c.replace("`", "") for c in summary.cells(r, summary.RANGE_COLUMN in cols)] for r in rs]
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
        hits = browser.evaluate("""(async () => {
            for (let i = 0; i < 100; i++) {
              const n = document.querySelectorAll('#search-results li').length;
              if (n) return n;
              await new Promise(r => setTimeout(r, 100));
            }
            return 0; })()""")
    assert hits > 0, "the site's search found nothing for 'warp'"


def test_a_request_to_another_host_fails_the_check(tmp_path):
    """The check is not vacuous: a page that pulls a script, a font and an image from elsewhere fails it,
    and nothing reaches those hosts (requests are refused in the browser)."""
    (tmp_path / "page.html").write_text(
        "<!doctype html><html><head>"
        '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>'
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Lato">'
        '</head><body><p>Inline math $x^2$ left raw.</p><img src="http://example.com/plot.png">'
        '<img src="local.png"></body></html>')
    (tmp_path / "local.png").write_bytes(base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="))
    b = Browser(need_chromium())
    try:
        with serve(tmp_path) as (base, _):
            report = b.open(f"{base}/page.html")
    finally:
        b.close()
    found = problems(report)
    assert {"https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js", "http://example.com/plot.png"} <= set(
        report["external"]), report["external"]
    assert any(f.startswith("request to a non-local host") for f in found)
    assert any(f.startswith("image did not load: http://example.com/") for f in found)
    assert not any(f.startswith("image did not load") and "local.png" in f for f in found), "the local image loaded"
    assert any(f.startswith("raw math left") for f in found)


PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
LAYOUT_STYLE = ("<style>body { margin: 0; font: 16px sans-serif; } article { width: 700px; margin-left: 40px; }"
                " td, th { padding: 4px 8px; } .scroll { overflow-x: auto; }"
                " pre { white-space: pre-wrap; width: 320px; font: 14px/20px monospace; }</style>")


def _layout_page(body: str) -> str:
    return (f"<!doctype html><html><head><title>t</title>{LAYOUT_STYLE}</head><body><article class='bd-article'>"
            f"<section id='one'><h1>One</h1>{body}</section></article></body></html>")


def test_each_layout_check_catches_its_fault(tmp_path):
    """The new checks are not vacuous: a page with one fault of each kind gets each complaint, and a
    page that does the same things right gets none."""
    long_line = "int x = a_long_expression + another_long_expression + yet_another_long_one;"
    bad = _layout_page(
        "<div class='scroll'><table><tr><td style='white-space: nowrap'>" + "wide " * 300 + "</td></tr></table></div>"
        "<table class='dataframe'><thead><tr><th></th><th>ms</th></tr></thead>"
        "<tbody><tr><th>0</th><td>1.0</td></tr></tbody></table>"
        "<p>Run <code style='white-space: nowrap; display: inline-block; width: 2000px'>"
        + "a_very_long_identifier_" * 3 + "</code> once.</p>"
        "<figure><img src='local.png' alt='A bar chart of the three kernels and their times'></figure>"
        "<figure><img src='local.png' alt='abc123.png'><figcaption>The times.</figcaption></figure>"
        "<p>The log is in notes/scale.md, at commit 28c239f.</p>"
        f"<div class='highlight'><pre><span class='linenos'>1</span>{long_line}\n"
        "<span class='linenos'>2</span>return x;\n</pre></div>"
        "<details><summary>More</summary><div style='height: 33000px'>tall</div></details>")
    hang = "display: block; padding-left: 3ch; text-indent: -3ch"
    num = "display: inline-block; width: 3ch; text-indent: 0"
    clean = _layout_page(
        "<div class='scroll'><table><tr><td>narrow</td><td>1.0</td></tr></table></div>"
        "<table class='dataframe'><thead><tr><th></th><th>ms</th></tr><tr><th>kernel</th><th></th></tr></thead>"
        "<tbody><tr><th>scale</th><td>1.0</td></tr></tbody></table>"
        "<p>Run <code>short_name</code> once; the hash <code>28c239f</code> is code. Nothing was dismissed.</p>"
        "<figure><img src='local.png' alt='A bar chart of the three kernels and their times'>"
        "<figcaption>The times.</figcaption></figure>"
        f"<div class='highlight'><pre><span style='{hang}'><span class='linenos' style='{num}'>1</span>{long_line}"
        f"</span><span style='{hang}'><span class='linenos' style='{num}'>2</span>return x;</span></pre></div>"
        "<details><summary>More</summary><div style='height: 3000px'>tall enough</div></details>")
    (tmp_path / "bad.html").write_text(bad)
    (tmp_path / "clean.html").write_text(clean)
    (tmp_path / "local.png").write_bytes(PIXEL)
    b = Browser(need_chromium())
    try:
        with serve(tmp_path) as (base, _):
            reports = {name: b.open(f"{base}/{name}.html") for name in ("bad", "clean")}
    finally:
        b.close()
    found = problems(reports["bad"])
    expected = {
        "too-wide table": "table wider than its box: table 1",
        "pandas index": "pandas index column left in: table 2",
        "2000 px inline code": "page 20",
        "figure without caption": "image local.png in § \"One\" (#one): no caption",
        "alt text a file name": "alt text is a file name (abc123.png)",
        "notes/ mention": "internal wording (a repository path: 'notes/')",
        "commit hash": "internal wording (a commit hash: '28c239f')",
        "wrapped line-numbered block": "code runs under its line numbers: in § \"One\" (#one) (line 1 of 2",
        "open height": "33,",
    }
    missing = {what: text for what, text in expected.items() if not any(text in f for f in found)}
    assert not missing, f"checks that did not fire: {missing}\ncomplaints: {found}"
    width = [f for f in found if f.startswith("page ")]
    assert width and "<code" in width[0] and "a_very_long_identifier_" in width[0], width
    assert reports["bad"]["height"] <= HEIGHT_BUDGET, "the tall part is in a closed dropdown"
    assert problems(reports["clean"]) == [], problems(reports["clean"])
    assert reports["clean"]["opened"] == 1 and reports["clean"]["open_height"] > reports["clean"]["height"]


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


def _by_page(rendered: dict, kind: str) -> dict[str, list[str]]:
    """The complaints of one kind (see KINDS), page by page, for the pages that have any."""
    shown = {p: r for p, r in rendered.items() if p != "_server" and "redirect" not in r}
    assert shown, "no page was rendered: the check would prove nothing"
    return {p: c for p, r in shown.items() if (c := problems(r, {kind}))}


def _listing(bad: dict[str, list[str]]) -> str:
    return "\n".join(f"{page}: {c}" for page, cs in bad.items() for c in cs)


@pytest.mark.book
def test_every_page_fits_its_height_budget(rendered):
    """A chapter reads in one sitting: its height at 1280 px wide, dropdowns closed, within budget
    (16,000 CSS px, capstones 20,000); and a reader who opens every dropdown and hidden cell (the
    <details> of sphinx-design, kernelbook and myst-nb's hide-input/hide-output, sphinx-togglebutton's
    hidden content) still meets an end (32,000, capstones 40,000)."""
    measured = [r for p, r in rendered.items() if p != "_server" and "height" in r]
    assert measured and any(r.get("opened") for r in measured), "no page has a dropdown: opening proved nothing"
    bad = _by_page(rendered, "height")
    assert not bad, "pages taller than their budget:\n" + _listing(bad)


@pytest.mark.book
def test_tables_fit_their_box_and_show_no_pandas_index(rendered):
    """No table in the article is wider than the box that shows it (the article, or a scrolling or
    clipping container such as pydata's table wrapper), and no table shows pandas' unnamed index
    (an empty first header cell over rows that start with <th>)."""
    bad = _by_page(rendered, "table")
    assert not bad, "tables a reader must scroll sideways or that show an unnamed index:\n" + _listing(bad)


@pytest.mark.book
def test_no_page_is_wider_than_the_window(rendered):
    """At 1280 px wide (everything opened) no page scrolls sideways; the complaint names the element
    whose right edge is largest."""
    bad = _by_page(rendered, "width")
    assert not bad, "pages wider than the window:\n" + _listing(bad)


@pytest.mark.book
def test_every_figure_has_a_caption_and_a_description(rendered):
    """Every image in the article (cell outputs and figures) sits in a <figure> with a caption and has
    alt text that describes it: not empty, not a file name or hash, at least three words."""
    bad = _by_page(rendered, "figure")
    assert not bad, "images without a caption or a description:\n" + _listing(bad)


@pytest.mark.book
def test_no_internal_wording_in_the_prose(rendered):
    """The reader-visible prose (not code, not a cell's input) uses none of INTERNAL_WORDING."""
    bad = _by_page(rendered, "wording")
    assert not bad, "working-notes wording in the prose:\n" + _listing(bad)


@pytest.mark.book
def test_line_numbers_keep_their_gutter(rendered):
    """A code block with line numbers never lets a wrapped line run back under the numbers.

    The rule, measured in the browser: for Pygments' inline numbers (``span.linenos`` inside ``pre``),
    the code column of a line starts at the right edge of its number; the rendered text of that line
    (a DOM range from after its number to before the next one) must not have a box that starts left
    of it. A line that wraps with a hanging indent passes; one that wraps back to the pre's edge fails,
    whatever the CSS that made it wrap. For table-style numbers (``td.linenos``) the code cell may not
    be taller than the column of numbers by half a line or more (a wrapped line lines up with no
    number).
    """
    bad = _by_page(rendered, "gutter")
    assert not bad, "code blocks whose wrapped lines run under the line numbers:\n" + _listing(bad)
