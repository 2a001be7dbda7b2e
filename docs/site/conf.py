"""Sphinx configuration of kvcost's reading site (`make site` → build/site/index.html).

The pages are the committed notebooks as they are stored — their outputs, never re-executed
(``nb_execution_mode = "off"``) — in reading order, each with a "Run this notebook" box and its
parameter table from docs/notebooks.md; the index is the README's own sections (its findings and the
decision table), read from README.md at build time so that the two never drift; then the notebook
contract (docs/notebooks.md), the API (docs/api.md and autodoc) and docs/architecture.md.

``docs/site/notebooks`` is a link to the repository's ``notebooks/``: the notebooks are read in place.
A Binder button appears when the public repository is named: ``make site SITE_REPO=https://github.com/OWNER/kvcost``
(or ``KVCOST_SITE_REPO`` in the environment; ``KVCOST_SITE_BRANCH``, default ``main``).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import kvcost

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

project = "kvcost"
author = "the kvcost authors"
copyright = "the kvcost authors (code MIT; the post quoted is ML Kenya's, CC BY 4.0)"
release = version = kvcost.__version__

extensions = ["myst_nb", "sphinx.ext.autodoc"]
root_doc = "index"
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "README.md"]
templates_path: list[str] = []
html_static_path = ["_static"]
html_css_files = ["kvcost.css"]

# The notebooks' stored outputs are the results: the site shows them as committed.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}
autodoc_typehints = "signature"
# Type aliases and dataclass fields are documented where they are defined; the references autodoc
# cannot resolve (numpy's ArrayLike, typing internals) are not the site's to fix.
nitpicky = False

REPO = os.environ.get("KVCOST_SITE_REPO", "").rstrip("/")
BRANCH = os.environ.get("KVCOST_SITE_BRANCH", "") or "main"
BINDER = "https://mybinder.org"
LAB = "http://localhost:8888/lab/tree"  # `make lab` serves the repository root on port 8888

html_theme = "sphinx_book_theme"
html_title = "kvcost"
html_favicon = "_static/favicon.svg"  # else the browser asks for /favicon.ico, a 404 in the console
html_context = {"default_mode": "light"}  # pydata-sphinx-theme logs an error for an unset mode
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "show_toc_level": 2,
    "navigation_with_keys": False,
}
if REPO:
    html_theme_options |= {
        "repository_url": REPO,
        "repository_branch": BRANCH,
        # launch paths are path_to_docs/pagename: "" gives notebooks/NN_name.ipynb, the repository's own
        "path_to_docs": "",
        "use_repository_button": True,
        "launch_buttons": {"binderhub_url": BINDER, "notebook_interface": "jupyterlab"},
    }


# --- the index: the README's own sections -------------------------------------------------------

def readme_sections() -> dict[str, str]:
    """README.md cut at its ``## `` headings: {"intro": text before the first, heading: section with it}."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    parts = re.split(r"^(?=## )", text, flags=re.M)
    intro = re.sub(r"\A# .*\n", "", parts[0])
    out = {"intro": intro}
    for part in parts[1:]:
        out[part.splitlines()[0][3:].strip()] = part
    return out


def _site_paths(md: str) -> str:
    """README paths are relative to the repository root; the index lives in docs/site/."""
    md = re.sub(r'<img src="figures/([^"]+)"[^>]*>', r"![\1](../../figures/\1)", md)  # sized by kvcost.css
    # A notebook's page, by its document name (a Markdown link would be resolved through docs/site/notebooks,
    # the link to notebooks/, to a file outside the site).
    md = re.sub(r"\[([^\]]*)\]\(notebooks/([^)]+)\.ipynb\)",
                lambda m: f"{{doc}}`{m.group(1).strip('`')} </notebooks/{m.group(2)}>`", md)
    return re.sub(r"\]\((figures|data|docs)/", r"](../../\1/", md)


def expand_readme(source: str) -> str:
    """Replace each ``<!-- readme: HEADING -->`` line with that README section (a missing one is an error)."""
    sections = readme_sections()

    def sub(m: re.Match) -> str:
        name = m.group(1).strip()
        if name not in sections:
            raise ValueError(f"docs/site/index.md: README.md has no section '## {name}' (it has {sorted(sections)})")
        return _site_paths(sections[name])
    return re.sub(r"^<!-- readme: (.+?) -->$", sub, source, flags=re.M)


# --- the notebook pages: a run box and the notebook's contract ----------------------------------

def contract_sections() -> dict[str, str]:
    """docs/notebooks.md's ``### STEM — title`` sections: {stem: body without the heading}."""
    text = (ROOT / "docs" / "notebooks.md").read_text(encoding="utf-8")
    out = {}
    for m in re.finditer(r"^### (\S+) — [^\n]*\n(.*?)(?=^##|\Z)", text, flags=re.M | re.S):
        out[m.group(1)] = m.group(2).strip()
    return out


def run_box(stem: str) -> str:
    path = f"notebooks/{stem}.ipynb"
    ways = [f"**JupyterLab**: `make lab` in a checkout, then open [`{path}`]({LAB}/{path})"]
    if REPO:
        owner_repo = REPO.removeprefix("https://github.com/")
        ways.append(f"**Binder**: [launch it]({BINDER}/v2/gh/{owner_repo}/{BRANCH}?urlpath=lab/tree/{path})")
    ways.append(f"**other parameters**: `make run NB={stem} ARGS='-p NAME VALUE'`")
    return "\n".join([
        ":::{admonition} Run this notebook",
        ":class: tip run-this-notebook",
        "",
        " · ".join(ways) + ".",
        "The outputs below are the committed ones, computed with the default parameters; the parameters "
        "and the tables it writes are in the fold below.",
        ":::",
    ])


def params_box(stem: str, body: str) -> str:
    """The notebook's section of docs/notebooks.md, folded (a <details> block: its text is in the page)."""
    return "\n".join([
        f'<details class="notebook-contract"><summary>Parameters and tables of <code>{stem}</code></summary>',
        "",
        body,
        "",
        "From [the notebook contract](/contract.md) (docs/notebooks.md): every parameter is checked before "
        f"the kernel starts; `make run` writes to `results/runs/{stem}/`.",
        "",
        "</details>",
    ])


def expand_notebook(stem: str, source: str) -> str:
    """The notebook as stored, with a run box and its contract under the title (the first cell's heading)."""
    nb = json.loads(source)
    contract = contract_sections()
    if stem not in contract:
        raise ValueError(f"docs/notebooks.md has no section '### {stem} — …' for notebooks/{stem}.ipynb")
    first = nb["cells"][0]
    text = "".join(first["source"]) if isinstance(first["source"], list) else first["source"]
    title, _, rest = text.partition("\n")
    if first["cell_type"] != "markdown" or not title.startswith("# "):
        raise ValueError(f"notebooks/{stem}.ipynb: the first cell is not the '# NN · Title' heading (CONTRIBUTING.md)")
    first["source"] = "\n\n".join([title, run_box(stem), params_box(stem, contract[stem]), rest])
    return json.dumps(nb)


# --- the API pages ---------------------------------------------------------------------------------

# kvcost's docstrings write |x| for an absolute value, as plain text reads it; reStructuredText reads it
# as a substitution (none is defined anywhere in kvcost), so autodoc would fail on it. Outside ``literals``
# the bars are escaped.
_LITERAL_OR_BARS = re.compile(r"(``.*?``)|(?<![\\|])\|(?=\S)([^|`]*?\S)\|(?!_)")


def _escape_bars(line: str) -> str:
    return _LITERAL_OR_BARS.sub(lambda m: m.group(1) or rf"\|{m.group(2)}\|", line)


def on_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    lines[:] = [_escape_bars(line) for line in lines]


def on_source_read(app, docname: str, source: list[str]) -> None:
    if docname == "index":
        source[0] = expand_readme(source[0])
    elif docname.startswith("notebooks/"):
        source[0] = expand_notebook(docname.split("/", 1)[1], source[0])


def setup(app) -> dict:
    app.connect("source-read", on_source_read)
    app.connect("autodoc-process-docstring", on_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
