"""The built site, opened page by page in headless Chromium, as a reader's browser would show it.

The book is built once (test_book's build), served on 127.0.0.1, and every page is loaded in Debian's
Chromium, driven over the DevTools protocol. Each page must answer 200, show no error output, load
every image, leave no raw ``$…$`` math behind (MathJax, served by the site itself, rendered it) and
make no request to any host but the local server: every request is intercepted, and one to any
other host is refused before it leaves the machine and fails the test. A screenshot of each page's
first screen is kept beside the built site (``<build>/screenshots/``) for a human to look at.
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
import subprocess
import tempfile
import threading
import time
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

class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol (websocket-client).

    Every request the page makes is paused (Fetch domain): local ones continue, any other is failed
    before it is sent and recorded in ``external``. Chromium's own resolver also maps every host but
    localhost to 'not found', so nothing leaves the machine even for requests the page does not make.
    """

    def __init__(self, exe: str, width: int = 1280, height: int = 900):
        import websocket  # websocket-client, in requirements-dev.txt

        # Chromium's helper processes may still be writing to the profile as it is removed: never an error
        self._profile = tempfile.TemporaryDirectory(prefix="kb-chromium-", ignore_cleanup_errors=True)
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--disable-default-apps", "--dns-prefetch-disable",
                 "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
                 f"--window-size={width},{height}", "--remote-debugging-port=0",
                 f"--user-data-dir={self._profile.name}", "about:blank"]
        self.proc = subprocess.Popen([exe, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and len(port_file.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"Chromium ({exe}) did not start its DevTools endpoint")
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{port_file.read_text().splitlines()[1]}",
                                              timeout=120, suppress_origin=True)
        self._id = 0
        self.events: list[dict] = []
        self.external: list[str] = []
        target = next(t["targetId"] for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.bringToFront")  # a background page is not painted: its screenshot would never come
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable")
        self.call("Fetch.enable", patterns=[{"urlPattern": "*"}])
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)

    # -- protocol
    def _recv(self) -> dict:
        msg = json.loads(self.ws.recv())
        if msg.get("method") == "Fetch.requestPaused":
            p = msg["params"]
            url = p["request"]["url"]
            if is_local(url):
                self.call("Fetch.continueRequest", requestId=p["requestId"], _wait=False)
            else:
                self.external.append(url)
                self.call("Fetch.failRequest", requestId=p["requestId"], errorReason="BlockedByClient", _wait=False)
        elif "method" in msg:
            self.events.append(msg)
        return msg

    def send(self, method: str, session: str | None = None, _wait: bool = True, **params) -> dict:
        self._id += 1
        mid = self._id
        msg = {"id": mid, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        if not _wait:
            return {}
        while True:
            reply = self._recv()
            if reply.get("id") == mid:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def call(self, method: str, _wait: bool = True, **params) -> dict:
        """A command to the page's session."""
        return self.send(method, session=self.session, _wait=_wait, **params)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, e in enumerate(self.events):
                if e["method"] == method:
                    return self.events.pop(i)
            self._recv()
        raise TimeoutError(f"no {method} within {timeout} s")

    def evaluate(self, expression: str, timeout: float = 60):
        res = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True,
                        timeout=int(timeout * 1000))
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {json.dumps(res['exceptionDetails'])[:1500]}")
        return res["result"].get("value")

    # -- pages
    def open(self, url: str) -> dict:
        """Load ``url`` and return what a reader would see (see PAGE_REPORT), plus status and requests."""
        self.events.clear()
        self.external.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        report = self.evaluate(PAGE_REPORT)
        responses = [e["params"]["response"] for e in self.events if e["method"] == "Network.responseReceived"]
        doc = [r for r in responses if r["url"].split("#")[0] == url.split("#")[0]]
        report["status"] = doc[0]["status"] if doc else None
        report["failed_responses"] = [f"{r['status']} {r['url']}" for r in responses if r["status"] >= 400]
        report["requested"] = [e["params"]["request"]["url"] for e in self.events
                               if e["method"] == "Network.requestWillBeSent"]
        report["external"] = sorted(set(self.external) | {u for u in report["requested"] if not is_local(u)})
        report["js_errors"] = [e["params"]["exceptionDetails"].get("exception", {}).get("description")
                               or e["params"]["exceptionDetails"].get("text")
                               for e in self.events if e["method"] == "Runtime.exceptionThrown"]
        return report

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            self._profile.cleanup()


# What a page shows once it has settled: MathJax done, images loaded or failed.
PAGE_REPORT = r"""
(async () => {
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
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
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
  return {
    height: Math.max(document.documentElement.scrollHeight, document.body.scrollHeight),
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
})()
"""


HEIGHT_BUDGET = 16_000  # CSS px at 1280 px wide, dropdowns closed: a chapter read in one sitting
CAPSTONE_BUDGET = 20_000


def budget(page: str) -> int:
    """The rendered-height budget of a page (capstone chapters get a little more)."""
    return CAPSTONE_BUDGET if "capstone" in page else HEIGHT_BUDGET


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
                    out[rel] = {"status": None, "external": sorted(set(b.external)), "failed_responses": [],
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
        shot = site.parent / "screenshots" / (page.replace("/", "__").removesuffix(".html") + ".png")
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
