"""Passkey retrieval on a real decoder: a resumable grid of (context, trial, variant) cells.

    python scripts/real_model_passkey.py --context 1024 --trials 20 \
        --variants exact fa3 fa3:frac_bits=7 fa3:frac_bits=4 store:q4_0
    python -m kvcost.runs.real_model_passkey --context 1024         # the same job
    python scripts/real_model_passkey.py --model gemma3-270m --context 4096 --variants exact fa3
    python scripts/real_model_passkey.py --model gemma3-270m --task niah_multikey_2 --context 4096 --variants exact fa3
    python -m kvcost.sweep run real_model_passkey            # the whole grid as a sweep (sweeps/)

Trial i of a context puts the needle at depth (i + 0.5) / trials with seed 1000 * context + i
(kvcost.experiments.real_decoder_passkey.build_prompt). One CSV row per cell, appended as soon as a
trial's variants are scored (passkey.csv in the decoder's results folder: data/real_model/ for SmolLM2,
data/real_model/gemma3_270m/ for Gemma, as its other runs): ``context, trial, depth, tokens, variant, success,
margin, seconds``; cells already in the file are skipped. Provenance in passkey.json beside it. ``--task
niah_multikey_2`` writes ``niah_multikey_2.csv`` there instead (the same columns).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvcost import provenance
from kvcost.experiments import real_decoder_passkey as pk
from kvcost.models import decoders
from kvcost.paths import repo_root
from kvcost.retrieval import ruler
from kvcost.script_args import checked, int_at_least

ROOT = repo_root()

OUT = ROOT / "data" / "real_model" / "passkey.csv"


def default_out(model: str, task: str = "niah_single_1") -> Path:
    """Where decoder ``model``'s rows of ``task`` go by default, in its results folder
    (kvcost.models.decoders.Decoder.data: data/real_model/ for SmolLM2, ``data/real_model/gemma3_270m/`` for Gemma):
    ``passkey.csv`` (:data:`OUT` for SmolLM2) for ``niah_single_1``, ``<task>.csv`` for another RULER task."""
    return decoders.decoder(model).results_file(pk.results_name(task))


FIELDS = ["context", "trial", "depth", "tokens", "variant", "success", "margin", "seconds", provenance.CODE_COLUMN]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line (a sweep checks each run's flags with it before anything runs):
    adds ``trial_list``, the trials to run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(ruler.TEMPLATES), default=decoders.DEFAULT_DECODER,
                    help="the real decoder (kvcost.models.decoders.DECODERS)")
    ap.add_argument("--task", choices=list(ruler.TASKS), default="niah_single_1",
                    help="the RULER task (kvcost.retrieval.ruler.TASKS; default niah_single_1)")
    ap.add_argument("--context", type=int_at_least(256), nargs="+", required=True, help="prompt lengths in tokens")
    ap.add_argument("--trials", type=int_at_least(1), default=20, help="trials per context: depth (i + 0.5) / trials")
    ap.add_argument("--first-trial", type=int, default=0)
    ap.add_argument("--only", type=int_at_least(1), default=None, help="run only this many trials from --first-trial "
                    "(depths and seeds still those of --trials)")
    ap.add_argument("--trial", type=int, nargs="+", default=None,
                    help="only these trials (0-based, < --trials; a sweep runs one trial per run)")
    ap.add_argument("--variants", type=checked(pk.parse_variant), nargs="+", default=["exact", "fa3"],
                    help="exact, store:<fmt>, fa3[:k=v,...], fa3full[:k=v,...]")
    ap.add_argument("--order", choices=["trial", "variant"], default="trial",
                    help="trial (default): each trial's variants together, so exact and the fa3 variants share "
                    "one exact prefix; variant: each variant's trials before the next variant's, so a run stopped "
                    "early leaves whole (context, variant) cells (for stored formats, which share nothing)")
    ap.add_argument("--threads", type=int_at_least(1), default=2)
    ap.add_argument("--out", type=Path, default=None,
                    help="the CSV rows are appended to (provenance beside it); default: the model's (default_out)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = default_out(args.model, args.task)
    for v in args.variants:                 # a format this decoder's cache cannot store fails now, not mid-grid
        fmt = decoders.stored_format(v)
        if fmt is not None:
            try:
                decoders.format_for(fmt, args.model)
            except ValueError as e:
                ap.error(f"--variants {v}: {e}")
    if not 0 <= args.first_trial < args.trials:
        ap.error(f"--first-trial must be in [0, {args.trials}), got {args.first_trial}")
    last = args.trials if args.only is None else min(args.trials, args.first_trial + args.only)
    args.trial_list = list(range(args.first_trial, last))
    if args.trial is not None:
        if min(args.trial) < 0 or max(args.trial) >= args.trials:
            ap.error(f"--trial: trials are numbered 0 .. {args.trials - 1} (--trials {args.trials}), got {args.trial}")
        args.trial_list = sorted(set(args.trial))
    return args


def cells(args: argparse.Namespace) -> list[tuple[int, int, list[str]]]:
    """The grid in run order, as ``(context, trial, variants run on that trial's prompt together)``:
    ``--order trial`` gives each trial all its variants at once; ``--order variant`` one variant per
    entry, every trial of a variant before the next variant (contexts outermost either way)."""
    if args.order == "trial":
        return [(c, i, list(args.variants)) for c in args.context for i in args.trial_list]
    return [(c, i, [v]) for c in args.context for v in args.variants for i in args.trial_list]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, tok = decoders.load(args.model, args.threads)
    attn = pk.FA3Attention()
    attn.register(model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    provenance.write_run(
        args.out.with_suffix(".json"), started=True, machine=True,
        command="python scripts/real_model_passkey.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        versions=decoders.versions(args.model),
        note={"model": args.model, "task": args.task, "gguf_sha256": provenance.sha256(decoders.gguf_path(args.model))})
    done = provenance.finished_keys(args.out, [("context", int), ("trial", int), ("variant", str)])
    with provenance.appending(args.out, FIELDS) as write:
        for c, i, variants in cells(args):
            todo = [v for v in variants if (c, i, v) not in done]
            if not todo:
                continue
            depth = (i + 0.5) / args.trials
            prompt = ruler.build_prompt(tok, c, depth, seed=1000 * c + i, model=args.model, task=args.task)
            results = pk.run_trial(model, attn, prompt, todo)
            for v in todo:
                res = results[v]
                write({"context": c, "trial": i, "depth": depth,
                       "tokens": len(prompt.prefix) + len(prompt.tail), "variant": v,
                       "success": int(res["success"]), "margin": repr(res["margin"]),
                       "seconds": round(res["seconds"], 1)})
                print(f"context {c} trial {i} depth {depth:.3f} {v}: {res}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
