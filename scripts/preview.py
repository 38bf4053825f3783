#!/usr/bin/env python3
"""Build one chapter (or reference page) on its own and look at it as a reader would.

    python scripts/preview.py 03_roofline            # build, then report and screenshots
    python scripts/preview.py pitfalls --no-build    # report on the last build of that page

Builds a small book with only the intro and that page (cross-references to other chapters warn
there; the full build checks them), opens the page in Debian's headless Chromium (driven by Playwright)
at 1280 px wide and prints what the site test checks: rendered height against the budget with every
dropdown closed and with every dropdown and hidden cell opened, the page's width, truncated or cramped
table cells, tables wider than their box or showing pandas' index, raw Markdown or working-notes
wording in the prose, code or equations wider than the page, code wrapped under its line numbers,
images without a caption or a description. Full-page screenshots (dropdowns closed), cut into
screens, go to <out>/shots/ to look at.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def build(page: str, out: Path) -> Path:
    src = "notebooks/" + page if (ROOT / "notebooks" / f"{page}.ipynb").is_file() else page
    toc = out / "_toc.yml"
    out.mkdir(parents=True, exist_ok=True)
    toc.write_text(f"format: jb-book\nroot: intro\nchapters:\n  - file: {src}\n")
    subprocess.run(["jupyter-book", "build", str(ROOT / "book"), "--toc", str(toc), "--path-output", str(out),
                    "--keep-going"], check=False)
    return out / "_build" / "html" / f"{src}.html"


def main() -> int:
    from test_site import Browser, budget, need_chromium, problems, serve

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("page", help="a chapter's stem (03_roofline) or a reference page (pitfalls)")
    ap.add_argument("--out", type=Path, help="build folder (default /tmp/kb-preview/<page>)")
    ap.add_argument("--no-build", action="store_true", help="reuse the last build")
    ap.add_argument("--screen", type=int, default=1800, help="height of one screenshot, CSS px")
    args = ap.parse_args()
    out = args.out or Path("/tmp/kb-preview") / args.page
    html = (out / "_build" / "html" / ("notebooks/" + args.page if (ROOT / "notebooks" / f"{args.page}.ipynb")
            .is_file() else args.page)).with_suffix(".html") if args.no_build else build(args.page, out)
    if not html.is_file():
        print(f"not built: {html}")
        return 1
    site = out / "_build" / "html"
    b = Browser(need_chromium())
    try:
        with serve(site) as (base, _):
            rel = html.relative_to(site).as_posix()
            r = b.open(f"{base}/{rel}")
            shots = out / "shots"
            shots.mkdir(exist_ok=True)
            for old in shots.glob("*.png"):
                old.unlink()
            for i, y in enumerate(range(0, r["height"], args.screen)):
                clip = {"x": 0, "y": y, "width": 1280, "height": min(args.screen, r["height"] - y), "scale": 0.6}
                b.screenshot(shots / f"{args.page}-{i:02d}.png", clip=clip)
    finally:
        b.close()
    print(f"{rel}: {r['height']:,} px tall closed (budget {budget(rel):,}), {r['open_height']:,} px with "
          f"{r['opened']} dropdowns open (budget {budget(rel, opened=True):,}), {r['page_width']:,} px wide, "
          f"{len(r['images'])} images")
    bad = problems(r)
    for p in bad:
        print("  -", p)
    print(f"screenshots: {shots}/ ({len(list(shots.glob('*.png')))} files)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
