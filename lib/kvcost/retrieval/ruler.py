"""RULER's needle-in-a-haystack prompts, built to a token budget with a decoder's tokenizer.

The tasks (:data:`TASKS`) as lm-evaluation-harness defines them: ``niah_single_1`` (one needle in the "repeat"
haystack, :func:`build_prompt`), ``niah_multikey_1`` (four needles of four keys in an essay haystack, one queried,
:func:`essay_multikey_prompt`) and ``niah_multikey_2`` (one needle among lines that are each another key's needle,
:func:`multikey_prompt`), each in the :class:`Template` its decoder is prompted with (:data:`TEMPLATES`). A
:class:`Prompt` is token ids: what the cache holds (``prefix``, the needle's span in it) and what is scored
(``tail``, ending in the value's tokens). Used by the real-decoder passkey grids
(:mod:`kvcost.experiments.real_decoder_passkey`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from kvcost.paths import data_path

__all__ = ["HAYSTACK", "KEYS", "TASKS", "results_name", "TEMPLATES", "Prompt", "Template", "template", "build_prompt",
           "multikey_prompt", "essay_multikey_prompt", "essay_sentences"]

#: RULER's "noise" haystack sentence (the passkey task of Mohtashami & Jaggi, 2023).
HAYSTACK = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
#: Needle keys (RULER draws a word; a fixed list keeps trials reproducible without a word list).
KEYS = ("apple", "river", "garden", "silver", "candle", "forest", "window", "harbor", "meadow", "lantern",
        "pepper", "castle", "velvet", "comet", "island", "marble", "thunder", "orchid", "falcon", "saddle")


@dataclass(frozen=True)
class Template:
    """How a decoder is prompted for the task, as RULER wraps it for the model's type: ``head`` before the
    instruction, ``close`` between the question and the answer prefix; ``bos``: the prompt starts with the
    tokenizer's BOS token (a base model's text does; SmolLM2's chat template has none); ``sep``: the text
    between the answer prefix and the value in the scored answer (its tokens are scored with the value's)."""

    head: str
    close: str
    bos: bool = False
    sep: str = " "


#: The prompt template of each decoder (kvcost.models.decoders.DECODERS names). SmolLM2-135M-Instruct: its chat
#: template (ChatML with its default system message), the value after a space. Gemma 3 270M, a base model: RULER's
#: ``base`` template, the task text and the answer prefix as plain text after BOS, and the value written as the
#: needle writes it (``is: 5973790``): greedy decoding after the answer prefix gives ``: 5973790.`` on the trials
#: tried at 512 and 1,024 tokens, so a space alone would score the model's punctuation, not its retrieval (RULER
#: scores by string match, where both count).
TEMPLATES: dict[str, Template] = {
    "smollm2-135m": Template(
        head="<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
             "<|im_start|>user\n",
        close="<|im_end|>\n<|im_start|>assistant\n"),
    "gemma3-270m": Template(head="", close=" ", bos=True, sep=": "),
}


def template(model: str) -> Template:
    """The :class:`Template` decoder ``model`` is prompted with (:data:`TEMPLATES`)."""
    if model not in TEMPLATES:
        raise ValueError(f"parameter 'model': no passkey prompt template for {model!r}; known: {list(TEMPLATES)}")
    return TEMPLATES[model]


def _frame(tok: Any, tpl: Template, key: str, plural: bool = False) -> tuple[str, str, list[int], Any]:
    """What every task's prompt shares for one query of ``key``: the instruction (``head``, RULER's template,
    singular for one needle and one value unless ``plural``), the question with the answer prefix (``ask``),
    the BOS ids the template starts with, and ``ids`` (text to token ids, no special tokens)."""
    some, number = ("Some special magic numbers are", "numbers") if plural else ("A special magic number is", "number")
    head = (tpl.head + f"{some} hidden within the following text. "
            f"Make sure to memorize it. I will quiz you about the {number} afterwards.\n")
    tail = (f"\nWhat is the special magic number for {key} mentioned in the provided text?" + tpl.close
            + f"The special magic number for {key} mentioned in the provided text is")
    bos = [tok.bos_token_id] if tpl.bos else []

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]
    return head, tail, bos, ids


def _needle(key: str, value: str) -> str:
    """RULER's needle sentence (``prepare_niah.NEEDLE`` with numbers as values)."""
    return f"One of the special magic numbers for {key} is: {value}."


@dataclass(frozen=True)
class Prompt:
    """Token ids of one trial: ``prefix`` (instruction, haystack and needle), ``tail`` (question,
    answer prefix and the value's tokens); the value, after its template's ``sep``, occupies the last
    ``n_answer`` tail tokens; ``needle``: the positions [start, end) of the needle sentence's tokens in ``prefix``."""

    prefix: list[int]
    tail: list[int]
    n_answer: int
    key: str
    value: str
    depth: float
    needle: tuple[int, int] = (0, 0)


def build_prompt(tok: Any, context: int, depth: float, seed: int, model: str = "smollm2-135m",
                 task: str = "niah_single_1") -> Prompt:
    """A RULER prompt of about ``context`` tokens with the needle at ``depth`` (0-1), in decoder ``model``'s
    :class:`Template`: ``task`` one of :data:`TASKS` (:func:`multikey_prompt` for ``niah_multikey_2``,
    :func:`essay_multikey_prompt` for ``niah_multikey_1``)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"parameter 'depth' must be in [0, 1], got {depth!r}")
    if task not in TASKS:
        raise ValueError(f"parameter 'task' must be one of {list(TASKS)}, got {task!r}")
    if task == "niah_multikey_2":
        return multikey_prompt(tok, context, depth, seed, model)
    if task == "niah_multikey_1":
        return essay_multikey_prompt(tok, context, depth, seed, model)
    tpl = template(model)
    rng = np.random.default_rng(seed)
    key = KEYS[int(rng.integers(len(KEYS)))]
    value = str(int(rng.integers(1_000_000, 10_000_000)))
    head, ask, bos, ids = _frame(tok, tpl, key, plural=True)
    needle = " " + _needle(key, value)
    hay = ids(" " + HAYSTACK)
    fixed = len(bos) + len(ids(head)) + len(ids(needle)) + len(ids(ask)) + 8
    n_rep = max(1, (context - fixed) // len(hay))
    cut = round(depth * n_rep)
    body = " " + " ".join([HAYSTACK] * cut) if cut else ""
    rest = " " + " ".join([HAYSTACK] * (n_rep - cut)) if n_rep - cut else ""
    prefix = bos + ids(head + body.lstrip() + needle + rest)
    # the needle's span: the tokens of the text before it and with it (a boundary token may straddle)
    span = (len(bos) + len(ids(head + body.lstrip())), len(bos) + len(ids(head + body.lstrip() + needle)))
    ans = ids(tpl.sep + value)
    return Prompt(prefix, ids(ask) + ans, len(ans), key, value, float(depth), span)


#: The RULER tasks :func:`build_prompt` writes, as lm-evaluation-harness defines them (``lm_eval/tasks/ruler/
#: niah_utils.py`` and ``prepare_niah.py``, EleutherAI/lm-evaluation-harness; the code of NVIDIA/RULER): the key a
#: word, the value a 7-digit number, one needle queried. ``niah_single_1``: the "repeat" haystack (:data:`HAYSTACK`
#: over and over). kvcost's committed grids of this task keep the template's plural instruction ("Some special magic
#: numbers are hidden … the numbers afterwards") and join the repeats with a space, where lm-eval, for one needle
#: and one value, writes the singular ("A special magic number is hidden … the number afterwards") and joins them
#: with newlines; the needle, the question and the answer prefix are lm-eval's. ``niah_multikey_2``: the "needle"
#: haystack, every line a needle of another key and value (the task vLLM's flash-attention PR #122 scores at 128k),
#: written as lm-eval writes it. ``niah_multikey_1``: the "essay" haystack with four needles of four distinct keys
#: (``num_needle_k=4``), one of them queried (:func:`essay_multikey_prompt`).
TASKS = ("niah_single_1", "niah_multikey_1", "niah_multikey_2")


def results_name(task: str = "niah_single_1") -> str:
    """The file a decoder's rows of ``task`` (:data:`TASKS`) are committed in, in its results folder:
    ``passkey.csv`` for ``niah_single_1``, ``<task>.csv`` for another."""
    if task not in TASKS:
        raise ValueError(f"parameter 'task' must be one of {list(TASKS)}, got {task!r}")
    return "passkey.csv" if task == "niah_single_1" else f"{task}.csv"

#: Adjectives and nouns of the multi-key task's keys (lm-eval draws "adjective-noun" words from wonderwords' lists;
#: fixed lists keep the trials reproducible offline): 40 x 50 = 2,000 distinct keys, enough lines for 32k tokens.
_ADJECTIVES = ("amber", "brave", "calm", "dusty", "eager", "faint", "gentle", "hollow", "icy", "jolly", "keen",
               "lively", "mellow", "narrow", "odd", "pale", "quiet", "rapid", "shy", "tidy", "upper", "vivid",
               "wary", "young", "zesty", "bold", "crisp", "damp", "empty", "fuzzy", "grand", "humble", "ivory",
               "jagged", "kind", "loud", "misty", "noble", "orange", "proud")
_NOUNS = ("anchor", "basket", "cactus", "dragon", "engine", "feather", "glacier", "hammer", "igloo", "jacket",
          "kettle", "ladder", "magnet", "needle", "oyster", "pebble", "quilt", "rocket", "spoon", "tunnel",
          "umbrella", "violin", "wagon", "yarn", "zipper", "bridge", "candle", "desert", "eagle", "fountain",
          "garden", "harbor", "island", "jungle", "kingdom", "lantern", "meadow", "nest", "orchard", "parrot",
          "quarry", "river", "saddle", "tower", "valley", "walnut", "beacon", "cliff", "dune", "ember")


def multikey_prompt(tok: Any, context: int, depth: float, seed: int, model: str = "smollm2-135m") -> Prompt:
    """RULER's ``niah_multikey_2`` of about ``context`` tokens in decoder ``model``'s :class:`Template`: a haystack
    of needle lines "One of the special magic numbers for {key} is: {value}." for distinct other keys, newline-joined,
    the queried key's line at ``depth`` (0-1) among them, then the question and the answer prefix, as lm-eval's
    ``prepare_niah.generate_input_output`` writes them for one needle and one value."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"parameter 'depth' must be in [0, 1], got {depth!r}")
    tpl = template(model)
    rng = np.random.default_rng(seed)
    keys = [f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS]
    order = rng.permutation(len(keys))
    key = keys[order[0]]
    value = str(int(rng.integers(1_000_000, 10_000_000)))
    head, ask, bos, ids = _frame(tok, tpl, key)
    needle = _needle(key, value)
    budget = context - (len(bos) + len(ids(head)) + len(ids(needle)) + len(ids(ask)) + 16)
    values = rng.integers(1_000_000, 10_000_000, size=len(keys))
    others: list[str] = []
    for i in order[1:]:                          # as many other keys' lines as the budget holds
        nxt = _needle(keys[i], str(int(values[i])))
        budget -= len(ids(nxt + "\n"))
        if budget < 0:
            break
        others.append(nxt)
    else:
        raise ValueError(f"parameter 'context': {context} tokens need more distinct keys than the {len(keys)} the "
                         "multi-key task has")
    n_lines = len(others)
    cut = round(depth * n_lines)
    before = "\n".join(others[:cut]) + ("\n" if cut else "")
    after = ("\n" + "\n".join(others[cut:])) if cut < n_lines else ""
    prefix = bos + ids(head + before + needle + after)
    span = (len(bos) + len(ids(head + before)), len(bos) + len(ids(head + before + needle)))
    ans = ids(tpl.sep + value)
    return Prompt(prefix, ids(ask) + ans, len(ans), key, value, float(depth), span)


#: The essay haystack's text. lm-eval's is Paul Graham's essays (the ``baber/paul_graham_essays`` dataset), which
#: cannot be fetched at run time; kvcost's is the public-domain novel its perplexity windows are read from (Project
#: Gutenberg's *Pride and Prejudice*, ``data/text``, sha256 in ``kvcost.runs.real_model_text``), its whitespace
#: collapsed and its words taken from the start, as lm-eval takes the essays'.
ESSAY = ("text", "pride_and_prejudice_full.txt")
#: RULER's needle depths (``prepare_niah.DEPTHS``: 40 percentages from 0 to 100).
DEPTHS = tuple(int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)))
#: Where a sentence ends: after ., ! or ? (and any closing quotes) before a space and a capital, a quote or an
#: underscore (the novel's italics), not after the titles Mr., Mrs., Dr. and St. lm-eval splits with nltk's punkt;
#: this rule is its stand-in (nltk and its punkt data are not installed), and it splits this text at the same full
#: stops on the sentences checked by eye.
_SENTENCE_END = re.compile(r"(?<!Mr\.)(?<!Mrs\.)(?<!Dr\.)(?<!St\.)(?<=[.!?])([\"'’”]*)\s+(?=[\"'‘“_A-Z])")


@lru_cache(maxsize=2)
def essay_sentences(parts: tuple[str, ...] = ESSAY) -> tuple[str, ...]:
    """The essay haystack's sentences, in order: the text at ``data_path(*parts)``, whitespace collapsed, split
    where :data:`_SENTENCE_END` matches."""
    text = re.sub(r"\s+", " ", data_path(*parts).read_text(encoding="utf-8")).strip()
    return tuple(s.strip() for s in _SENTENCE_END.sub(lambda m: m.group(1) + "\n", text).split("\n") if s.strip())


def essay_multikey_prompt(tok: Any, context: int, depth: float, seed: int, model: str = "smollm2-135m",
                          n_keys: int = 4) -> Prompt:
    """RULER's ``niah_multikey_1`` of about ``context`` tokens in decoder ``model``'s :class:`Template`: the essay
    haystack's first sentences (:func:`essay_sentences`), ``n_keys`` needles "One of the special magic numbers for
    {key} is: {value}." of distinct keys inserted between sentences, the queried key's at ``depth`` (0-1) of the
    haystack and the others at depths drawn from :data:`DEPTHS`, then the question for the queried key, as
    lm-eval's ``prepare_niah.generate_input_output`` writes it for four keys, one value and one query."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"parameter 'depth' must be in [0, 1], got {depth!r}")
    if n_keys < 2:
        raise ValueError(f"parameter 'n_keys' must be at least 2 (a multi-key task), got {n_keys!r}")
    tpl = template(model)
    rng = np.random.default_rng(seed)
    words = [f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS]
    keys = [words[i] for i in rng.choice(len(words), size=n_keys, replace=False)]
    values = [str(int(v)) for v in rng.choice(np.arange(1_000_000, 10_000_000), size=n_keys, replace=False)]
    others = sorted(float(d) / 100 for d in rng.choice(DEPTHS, size=n_keys - 1, replace=False))
    key, value = keys[0], values[0]
    head, ask, bos, ids = _frame(tok, tpl, key)
    needles = [_needle(k, v) for k, v in zip(keys, values)]
    budget = context - (len(bos) + len(ids(head)) + sum(len(ids(" " + n)) for n in needles) + len(ids(ask)) + 16)
    sents = essay_sentences()
    lo, hi = 0, len(sents)                       # the most leading sentences whose text fits the budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(ids(" ".join(sents[:mid]))) <= budget:
            lo = mid
        else:
            hi = mid - 1
    if lo == len(sents) or lo < 2:
        why = "more than the essay holds" if lo else "too short"
        raise ValueError(f"parameter 'context': {context} tokens is {why} for the essay haystack")
    hay = sents[:lo]
    cuts = [(round(depth * lo), 0)] + [(int(lo * d), i + 1) for i, d in enumerate(others)]
    pieces: list[str] = []
    at, start = 0, None
    for cut, which in sorted(cuts):             # lm-eval: sentences, then the next needle, in depth order
        pieces += list(hay[at:cut])
        at = cut
        if which == 0:
            start = " ".join([*pieces, ""]) if pieces else ""
        pieces.append(needles[which])
    pieces += list(hay[at:])
    before = start or ""
    body = " ".join(pieces)
    prefix = bos + ids(head + body)
    span = (len(bos) + len(ids(head + before)), len(bos) + len(ids(head + before + needles[0])))
    ans = ids(tpl.sep + value)
    return Prompt(prefix, ids(ask) + ans, len(ans), key, value, float(depth), span)
