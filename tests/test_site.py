"""The reading site (`make site`, docs/site/): built once from the committed notebooks, then read.

The build is Sphinx with myst-nb, warnings as errors, the notebooks' stored outputs shown as they are
(nothing re-executed). Static checks read the HTML: the pages in reading order with previous/next links,
the index made of the README's findings and decision table, each notebook page's run box and parameter
table, the stable API's modules, every internal link and image present, no machine path. The browser
checks load every page in headless Chromium (Debian's ``chromium``, which ``make site-deps`` installs,
driven by Playwright): no console error, no failed request, every image decoded, every internal link
answered, and the search page finding a notebook.
"""
from __future__ import annotations

import functools
import html.parser
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

import kvcost

ROOT = Path(__file__).resolve().parents[1]
SITE_SRC = ROOT / "docs" / "site"
STEMS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
# The flags the machine's notes give for Chromium as root on a closed network (no sandbox as root; no
# background connections, which the network would refuse and Chromium would log).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]


def chromium() -> str | None:
    return os.environ.get("KVCOST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
           "-d", str(out / ".doctrees"), str(SITE_SRC), str(out / "html")]
    env = {**os.environ, "KVCOST_SITE_REPO": ""}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"sphinx-build failed:\n{r.stdout}\n{r.stderr}"
    return out / "html"


class _Page(html.parser.HTMLParser):
    """Links, images, ids and classes of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (href, class)
        self.srcs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and "href" in a:
            self.links.append((a["href"], a.get("class", "")))
        if tag in ("img", "script") and a.get("src"):
            self.srcs.append(a["src"])
        if tag == "link" and a.get("href") and a.get("rel") in ("stylesheet", "icon"):
            self.srcs.append(a["href"])


@functools.cache
def parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def plain(html_text: str) -> str:
    """The text of a page: tags dropped, runs of spaces as one."""
    return re.sub(r"[ \t]+", " ", re.sub(r"<[^>]+>", " ", html_text))


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if not p.relative_to(site).parts[0].startswith("_"))


def _local(href: str) -> bool:
    s = urlsplit(href)
    return not s.scheme and not s.netloc and not href.startswith(("mailto:", "javascript:"))


# --- the build, read as files ---------------------------------------------------------------------

def test_every_notebook_has_a_page_in_reading_order(site):
    for stem in STEMS:
        assert (site / "notebooks" / f"{stem}.html").is_file(), stem
    order = ["index"] + [f"notebooks/{s}" for s in STEMS] + ["contract", "api", "architecture"]
    for i, name in enumerate(order):
        page = parse(site / f"{name}.html")
        here = (site / f"{name}.html").parent
        prev = [h for h, c in page.links if "left-prev" in c]
        nxt = [h for h, c in page.links if "right-next" in c]
        if i > 0:
            assert prev and (here / prev[0]).resolve() == (site / f"{order[i - 1]}.html").resolve(), (name, prev)
        if i + 1 < len(order):
            assert nxt and (here / nxt[0]).resolve() == (site / f"{order[i + 1]}.html").resolve(), (name, nxt)


def test_index_is_the_readme_findings_and_decision_table(site):
    text = (site / "index.html").read_text(encoding="utf-8")
    for heading in ("What the notebooks find", "Which KV dtype for which context", "The notebooks"):
        assert f">{heading}<" in text, heading
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- plan-table:start -->")[1].split("<!-- plan-table:end -->")[0]
    rows = [[c.strip() for c in r.strip().strip("|").split("|")] for r in table.strip().splitlines()[2:]]
    shown = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, flags=re.S)]
             for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", text, flags=re.S)]
    assert rows
    for row in rows:
        assert row in shown, row
    for stem in STEMS:  # the notebook table links each page
        assert f'href="notebooks/{stem}.html"' in text, stem


def test_each_notebook_page_has_its_outputs_run_box_and_parameters(site):
    for stem in STEMS:
        nb = json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))
        pngs = sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
        text = (site / "notebooks" / f"{stem}.html").read_text(encoding="utf-8")
        page = parse(site / "notebooks" / f"{stem}.html")
        figures = [s for s in page.srcs if s.startswith("../_images/")]
        assert len(figures) >= pngs, (stem, len(figures), pngs)
        assert "Run this notebook" in text and f"http://localhost:8888/lab/tree/notebooks/{stem}.ipynb" in text, stem
        words = plain(text)
        assert f"make run NB={stem}" in words, stem
        assert re.search(r"parameter\s+default\s+the post(&#8217;|&#39;|'|’)s value\s+allowed\s+meaning", words), stem
        assert re.search(r"out_dir\s+(&#39;|')results/" + stem, words), stem  # the contract's table, last row
        assert 'href="../contract.html"' in text, stem


def test_api_pages_document_the_stable_modules(site):
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    names = re.search(r"^from kvcost import (.+)$", api, flags=re.M).group(1).replace(" ", "").split(",")
    ids = parse(site / "api.html").ids
    for name in names:           # each documented name, under the module that holds it (kvcost.ALIASES)
        assert f"module-{kvcost.ALIASES.get(name, f'kvcost.{name}')}" in ids, name
    assert "module-kvcost.storage.formats" in ids
    assert "kvcost.models.footprint.cache_bytes" in ids


def test_internal_links_and_images_resolve_and_no_machine_paths(site):
    machine = [str(ROOT), str(Path.home()) + "/", str(site.parent)]
    for path in pages(site):
        text = path.read_text(encoding="utf-8")
        for m in machine:
            assert m not in text, (path.relative_to(site), m)
        page = parse(path)
        for ref in [h for h, _ in page.links] + page.srcs:
            if not _local(ref):
                continue
            s = urlsplit(ref)
            target = (path.parent / unquote(s.path)).resolve() if s.path else path
            assert target.is_file(), (path.relative_to(site), ref)
            assert site.resolve() in target.parents, (path.relative_to(site), ref)
            if s.fragment and target.suffix == ".html":
                assert s.fragment in parse(target).ids, (path.relative_to(site), ref)


def test_readme_shows_the_site():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/site_screenshot.png)" in readme and "`make site`" in readme
    assert (ROOT / "docs" / "site_screenshot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- the site, read in a browser --------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    exe = chromium()
    if not exe:
        pytest.skip("NO BROWSER: Debian's chromium is not installed (`make site-deps` installs it as root); "
                    "the site was built and checked as files, but NOT loaded in a browser")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


# Make every image load now (lazy ones too) and report those that fail to decode.
_BROKEN_IMAGES = """async () => {
  const imgs = [...document.images];
  imgs.forEach(i => { i.loading = 'eager'; });
  const bad = await Promise.all(imgs.map(i => i.decode().then(() => i.naturalWidth ? null : i.src, () => i.src)));
  return bad.filter(x => x);
}"""


def test_every_page_loads_in_chromium_without_errors(site, served, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    current = [""]
    page.on("console", lambda m: m.type == "error" and problems.append(f"{current[0]}: console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"{current[0]}: page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"{current[0]}: request failed: {r.url}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{current[0]}: {r.status} {r.url}"))
    links: dict[str, str] = {}
    ids: dict[str, set[str]] = {}
    for path in pages(site):
        rel = path.relative_to(site).as_posix()
        current[0] = rel
        url = urljoin(served, rel)
        page.goto(url, wait_until="load")
        broken = page.evaluate(_BROKEN_IMAGES)
        problems += [f"{rel}: image not loaded: {src}" for src in broken]
        ids[url] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        for href in page.eval_on_selector_all("a[href]", "els => els.map(a => a.href)"):
            if href.startswith(served):
                links.setdefault(href, rel)
    assert not problems, "\n".join(problems)
    assert len(ids) >= len(STEMS) + 4
    for href, where in sorted(links.items()):
        target, _, fragment = href.partition("#")
        if target in ids:
            assert not fragment or unquote(fragment) in ids[target], f"{where}: no #{fragment} in {target}"
        else:  # a file the pages link to (a notebook's download, a figure): the server must have it
            assert page.request.get(target).status == 200, f"{where}: {href}"
    page.close()


def test_search_finds_a_notebook(served, browser):
    page = browser.new_page()
    page.goto(urljoin(served, "search.html?q=accumulator"), wait_until="load")
    page.wait_for_selector("#search-results li a", timeout=30_000)
    hits = page.eval_on_selector_all("#search-results li a", "els => els.map(a => a.getAttribute('href'))")
    assert any("notebooks/04_accumulator_floor" in h for h in hits), hits
    page.close()
