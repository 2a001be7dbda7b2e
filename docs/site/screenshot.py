"""The README's picture of the reading site: one page of a built site, in headless Chromium.

    make site-screenshot      # = python docs/site/screenshot.py build/site docs/site_screenshot.png

Taken once and committed (docs/site_screenshot.png); nothing else writes it.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import threading
from pathlib import Path

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
        "--disable-background-networking", "--disable-component-update"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", type=Path, help="the built site (build/site)")
    ap.add_argument("out", type=Path, help="the PNG to write")
    ap.add_argument("--page", default="notebooks/06_long_range_needle.html", help="the page, from the site's root")
    ap.add_argument("--anchor", default="", help="an element's class to scroll to the top (default: the page's top)")
    args = ap.parse_args(argv)
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        raise SystemExit("error: no chromium (make site-deps installs Debian's)")
    from playwright.sync_api import sync_playwright

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(args.site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"http://127.0.0.1:{server.server_port}/{args.page}", wait_until="load")
            if args.anchor:
                page.eval_on_selector(f".{args.anchor}", "e => window.scrollTo(0, e.getBoundingClientRect().top"
                                      " + window.scrollY - 90)")
            page.wait_for_timeout(300)
            page.screenshot(path=str(args.out))
            browser.close()
    finally:
        server.shutdown()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
