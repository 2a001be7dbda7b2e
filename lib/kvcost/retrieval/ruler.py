"""RULER's needle-in-a-haystack prompts, built to a token budget with a decoder's tokenizer.

The tasks (:data:`TASKS`) as lm-evaluation-harness defines them: ``niah_single_1`` (one needle in the "repeat"
haystack, :func:`build_prompt`) and ``niah_multikey_2`` (one needle among lines that are each another key's needle,
:func:`multikey_prompt`), each in the :class:`Template` its decoder is prompted with (:data:`TEMPLATES`). A
:class:`Prompt` is token ids: what the cache holds (``prefix``, the needle's span in it) and what is scored
(``tail``, ending in the value's tokens). Used by the real-decoder passkey grids
(:mod:`kvcost.experiments.real_decoder_passkey`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["HAYSTACK", "KEYS", "TASKS", "TEMPLATES", "Prompt", "Template", "template", "build_prompt",
           "multikey_prompt"]

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
    :class:`Template`: ``task`` one of :data:`TASKS` (:func:`multikey_prompt` for ``niah_multikey_2``)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"parameter 'depth' must be in [0, 1], got {depth!r}")
    if task not in TASKS:
        raise ValueError(f"parameter 'task' must be one of {list(TASKS)}, got {task!r}")
    if task == "niah_multikey_2":
        return multikey_prompt(tok, context, depth, seed, model)
    tpl = template(model)
    rng = np.random.default_rng(seed)
    key = KEYS[int(rng.integers(len(KEYS)))]
    value = str(int(rng.integers(1_000_000, 10_000_000)))
    head = (tpl.head + "Some special magic numbers are hidden within the following text. "
            "Make sure to memorize it. I will quiz you about the numbers afterwards.\n")
    needle = f" One of the special magic numbers for {key} is: {value}."
    question = f"\nWhat is the special magic number for {key} mentioned in the provided text?" + tpl.close
    answer = f"The special magic number for {key} mentioned in the provided text is"
    bos = [tok.bos_token_id] if tpl.bos else []

    def ids(s: str) -> list[int]:
        return tok(s, add_special_tokens=False)["input_ids"]

    hay = ids(" " + HAYSTACK)
    fixed = len(bos) + len(ids(head)) + len(ids(needle)) + len(ids(question + answer)) + 8
    n_rep = max(1, (context - fixed) // len(hay))
    cut = round(depth * n_rep)
    body = " " + " ".join([HAYSTACK] * cut) if cut else ""
    rest = " " + " ".join([HAYSTACK] * (n_rep - cut)) if n_rep - cut else ""
    prefix = bos + ids(head + body.lstrip() + needle + rest)
    # the needle's span: the tokens of the text before it and with it (a boundary token may straddle)
    span = (len(bos) + len(ids(head + body.lstrip())), len(bos) + len(ids(head + body.lstrip() + needle)))
    ans = ids(tpl.sep + value)
    tail = ids(question + answer) + ans
    return Prompt(prefix, tail, len(ans), key, value, float(depth), span)


#: The RULER tasks :func:`build_prompt` writes, as lm-evaluation-harness defines them (``lm_eval/tasks/ruler/
#: niah_utils.py`` and ``prepare_niah.py``, EleutherAI/lm-evaluation-harness; the code of NVIDIA/RULER): the key a
#: word, the value a 7-digit number, one needle queried. ``niah_single_1``: the "repeat" haystack (:data:`HAYSTACK`
#: over and over). kvcost's committed grids of this task keep the template's plural instruction ("Some special magic
#: numbers are hidden … the numbers afterwards") and join the repeats with a space, where lm-eval, for one needle
#: and one value, writes the singular ("A special magic number is hidden … the number afterwards") and joins them
#: with newlines; the needle, the question and the answer prefix are lm-eval's. ``niah_multikey_2``: the "needle"
#: haystack, every line a needle of another key and value (the task vLLM's flash-attention PR #122 scores at 128k),
#: written as lm-eval writes it.
TASKS = ("niah_single_1", "niah_multikey_2")

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
    head = (tpl.head + "A special magic number is hidden within the following text. "
            "Make sure to memorize it. I will quiz you about the number afterwards.\n")
    question = f"\nWhat is the special magic number for {key} mentioned in the provided text?" + tpl.close
    answer = f"The special magic number for {key} mentioned in the provided text is"
    bos = [tok.bos_token_id] if tpl.bos else []

    def ids(s: str) -> list[int]:
        return tok(s, add_special_tokens=False)["input_ids"]

    def line(k: str, v: str) -> str:
        return f"One of the special magic numbers for {k} is: {v}."

    needle = line(key, value)
    budget = context - (len(bos) + len(ids(head)) + len(ids(needle)) + len(ids(question + answer)) + 16)
    values = rng.integers(1_000_000, 10_000_000, size=len(keys))
    others: list[str] = []
    for i in order[1:]:                          # as many other keys' lines as the budget holds
        nxt = line(keys[i], str(int(values[i])))
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
    return Prompt(prefix, ids(question + answer) + ans, len(ans), key, value, float(depth), span)
