"""Notebook 04b's tables: accumulation error on attention-like weights, flush intervals, DeepSeek's FP8 check."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from kvcost.floats import round_to
from kvcost.numerics import instructions, tensorcore
from kvcost.numerics.accum import PROFILES, accumulate, error_bound, exact_sum, hopper_sum, weight_profile
from kvcost.params import check_int

__all__ = ["DEEPSEEK_INPUTS", "UNIT_PANEL", "deepseek_check", "error_sweep", "flush_sweep", "profile_matrix",
           "unit_error_table", "unit_probe_table"]


def profile_matrix(n: int, d: int, needle_mass: float, seed: int) -> tuple[np.ndarray, list[str]]:
    """All profiles' terms as columns of one (n, 5 + d) matrix, rounded to float32 (products
    as a kernel would produce them); and the profile name of each column."""
    cols, names = [], []
    for kind in PROFILES:
        t = weight_profile(kind, n, needle_mass=needle_mass, d=d, seed=seed)
        t = t.reshape(n, -1)
        cols.append(t)
        names += [kind] * t.shape[1]
    x = np.concatenate(cols, axis=1).astype(np.float32).astype(np.float64)
    return np.ascontiguousarray(x), names


def error_sweep(ns: list[int], formats: list[str], strategies: list[str], block: int = 128,
                d: int = 8, needle_mass: float = 0.5, seed: int = 0) -> pd.DataFrame:
    """Error of every format x strategy on every weight profile, for each n.

    Strategies: those of :func:`kvcost.accum.accumulate` except ``hopper`` (that one is the
    fp32 tensor-core model, asked for as ``hopper`` and ``hopper_promoted`` (N_C = 128) and
    reported under format ``fp32``). Rows: profile, format, strategy, n, rel_error =
    max over the profile's columns of |computed - exact| / sum|x|, and the bounds
    (recursive, pairwise, blocked, probabilistic) in the same units.
    """
    block = check_int("block", block, lo=1)
    rows = []
    for n in ns:
        n = check_int("ns", n, lo=1)
        x, names = profile_matrix(n, d, needle_mass, seed)
        exact = exact_sum(x)
        abs_sum = exact_sum(np.abs(x))
        names_arr = np.array(names)
        runs = []
        for fmt in formats:
            for strat in strategies:
                if strat in ("hopper", "hopper_promoted"):
                    continue
                runs.append((fmt, strat, lambda fmt=fmt, strat=strat, x=x: accumulate(
                    x, fmt, strat, block=block if strat == "two_level" else None)))
        if "hopper" in strategies:
            runs.append(("fp32", "hopper", lambda x=x: hopper_sum(x)))
        if "hopper_promoted" in strategies:
            runs.append(("fp32", "hopper_promoted", lambda x=x: hopper_sum(x, promote=128)))
        for fmt, strat, fn in runs:
            got = fn()
            with np.errstate(invalid="ignore"):
                err = np.abs(got - exact) / abs_sum
            for prof in PROFILES:
                sel = names_arr == prof
                rows.append({"profile": prof, "format": fmt, "strategy": strat, "n": n,
                             "rel_error": float(np.max(err[sel]))})
    df = pd.DataFrame(rows)
    for kind in ("recursive", "pairwise", "probabilistic"):
        df[f"bound_{kind}"] = [float(error_bound(kind, r.n, r.format)) for r in df.itertuples()]
    df["bound_blocked"] = [float(error_bound("blocked", r.n, r.format, block=block)) for r in df.itertuples()]
    return df


def flush_sweep(intervals: list[int], n: int, tokens_per_step: int = 96, d: int = 8,
                needle_mass: float = 0.5, seed: int = 0) -> pd.DataFrame:
    """The Hopper model's error at context ``n`` when the tensor-core accumulator is flushed
    into fp32 every ``interval`` flash-attention steps of ``tokens_per_step`` tokens (FA3's FP8
    KV block: 96 for decode at head_dim 128, 192 for prefill with two-level accumulation, 224
    without; ``kvcost.fa3.tile_sizes``).

    Rows: interval, promote (terms), profile, rel_error (max over columns, / sum|x|)."""
    n = check_int("n", n, lo=1)
    tokens_per_step = check_int("tokens_per_step", tokens_per_step, lo=1)
    x, names = profile_matrix(n, d, needle_mass, seed)
    exact = exact_sum(x)
    abs_sum = exact_sum(np.abs(x))
    names_arr = np.array(names)
    rows = []
    for iv in [*intervals, None]:
        promote = None if iv is None else check_int("intervals", iv, lo=1) * tokens_per_step
        got = hopper_sum(x, promote=promote)
        err = np.abs(got - exact) / abs_sum
        for prof in PROFILES:
            sel = names_arr == prof
            rows.append({"interval": "never" if iv is None else str(iv), "promote": promote or 0, "profile": prof,
                         "rel_error": float(np.max(err[sel]))})
    return pd.DataFrame(rows)


#: Input distributions for the DeepSeek-V3 comparison: (name, mean of a, mean of b), unit spread,
#: uniform [0, 1) for ``uniform_positive``. The report does not state its inputs.
DEEPSEEK_INPUTS = (("normal", 0.0, 0.0), ("normal, channel mean 0.3", 0.3, 0.3), ("normal, mean 1", 1.0, 1.0),
                   ("uniform_positive", None, None))


def _unit_dots(a: np.ndarray, b: np.ndarray, frac_bits: int, promote_every: int | None) -> np.ndarray:
    """Column j: a[:, j] · b[:, j] on Hopper's FP8 unit with ``frac_bits`` kept (its register e8m{frac_bits})."""
    u = instructions.get(*HOPPER_FP8)
    if frac_bits != u.frac_bits:
        u = replace(u, frac_bits=frac_bits, rounding=f"RZ-E8M{min(frac_bits, 23)}")
    zero = np.zeros((1, 1), np.float32)
    return np.array([float(tensorcore.matmul_unit(u, a[None, :, j], b[:, j:j + 1], zero,
                                                  promote_every=promote_every)[0, 0]) for j in range(a.shape[1])])


def deepseek_check(K: int = 4096, trials: int = 200, frac_bits: tuple[int, ...] = (11, 12, 13, 14),
                   seed: int = 0) -> pd.DataFrame:
    """Normwise relative error of FP8 (e4m3) dot products of length K on Hopper's FP8 unit
    (:func:`kvcost.tensorcore.matmul`, wgmma ``m64n8k32.f32.e4m3.e4m3``, bit for bit MMA-Sim; other
    ``frac_bits`` narrow or widen its fraction bits and e8m register), as the outputs of a K-deep
    GEMM: ||model - exact||_2 / ||exact||_2 over ``trials`` outputs, without promotion and with
    DeepSeek-V3's N_C = 128. Inputs: :data:`DEEPSEEK_INPUTS`. Rows: inputs, mean_over_spread
    (of the products), frac_bits, K, normwise_rel_error, normwise_rel_error_promoted,
    median_elementwise_rel_error (|error| / |exact| per output: near-zero outputs dominate its
    maximum, so only the median is kept)."""
    K = check_int("K", K, lo=1)
    trials = check_int("trials", trials, lo=1)
    rng = np.random.default_rng(seed)
    rows = []
    for name, ma, mb in DEEPSEEK_INPUTS:
        if ma is None:
            a, b = rng.random((K, trials)), rng.random((K, trials))
        else:
            a, b = ma + rng.standard_normal((K, trials)), mb + rng.standard_normal((K, trials))
        a, b = round_to(a, "fp8_e4m3"), round_to(b, "fp8_e4m3")
        x = a * b                                   # exact: products of e4m3 values fit in float64
        exact = exact_sum(x)
        norm = float(np.linalg.norm(exact))
        for fb in frac_bits:
            got, gotp = _unit_dots(a, b, fb, None), _unit_dots(a, b, fb, 128)
            rows.append({"inputs": name, "mean_over_spread": float(abs(x.mean()) / x.std()), "frac_bits": fb, "K": K,
                         "normwise_rel_error": float(np.linalg.norm(got - exact)) / norm,
                         "normwise_rel_error_promoted": float(np.linalg.norm(gotp - exact)) / norm,
                         "median_elementwise_rel_error": float(np.median(np.abs(got - exact) / np.abs(exact)))})
    return pd.DataFrame(rows)


#: Hopper's FP8 wgmma: the unit DeepSeek-V3's GEMMs ran on (H800).
HOPPER_FP8 = ("Hopper", "m64n8k32.f32.e4m3.e4m3")
#: The units notebook 04b sets side by side: one per arithmetic the registry knows (data/tensorcore/units.csv).
UNIT_PANEL = (("Hopper", "m64n8k32.f32.e4m3.e4m3"), ("Ada Lovelace", "m16n8k32.f32.e4m3.e4m3.f32"),
              ("Hopper", "m64n8k16.f32.bf16.bf16"), ("Blackwell", "m64n8k32.kind::f8f6f4.f32.e4m3.e4m3"),
              ("RTX Blackwell", "m16n8k32.f32.e4m3.e4m3.f32"),
              ("Blackwell", "m128n8k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3"), ("CDNA3", "f32_16x16x32_fp8_fp8"))


def _label(u: instructions.Unit) -> str:
    """'Hopper wgmma e4m3', 'Blackwell tcgen05 mxf4nvf4.block16 e2m1', 'CDNA3 mfma fp8': arch, family, kind, type."""
    kind = next((p.removeprefix("kind::") for p in u.instr.split(".") if p.startswith("kind::")), "")
    if u.block:
        kind += f".block{u.block}"
    fam = u.family.removesuffix("_block")
    return " ".join(x for x in (u.arch, fam, kind if kind.startswith("mx") else "", u.a_type) if x)


def _ones(u: instructions.Unit, m: int, k: int, n: int) -> dict:
    kw = {}
    if u.block:
        kw = {"scale_a": np.ones((m, k // u.block)), "scale_b": np.ones((k // u.block, n))}
    return kw


def unit_probe_table(units=UNIT_PANEL, max_e: int = 40) -> pd.DataFrame:
    """The probe of each unit: one instruction with C = 2^E and a single product 1·1, for E = 0, 1, ...;
    ``kept_bits`` is the largest E at which D = 2^E + 1 (the smallest term that survives beside a large
    one, in binades below it). Rows: unit, arch, instr, scheme, F (the unit's fraction bits), rounding,
    kept_bits. kept_bits = min(F, the register's fraction bits) for the fused units."""
    rows = []
    for arch, instr in units:
        u = instructions.get(arch, instr)
        a = np.zeros((1, u.k))
        b = np.zeros((u.k, 1))
        a[0, 0] = b[0, 0] = 1.0
        kept = -1
        for e in range(max_e + 1):
            c = np.array([[2.0 ** e]], np.float32)
            d = tensorcore.matmul_unit(u, a, b, c, **_ones(u, 1, u.k, 1))
            if float(d[0, 0]) - 2.0 ** e == 1.0:
                kept = e
            else:
                break
        rows.append({"unit": _label(u), "arch": arch, "instr": instr, "scheme": u.scheme, "F": u.frac_bits,
                     "rounding": u.rounding, "kept_bits": kept})
    return pd.DataFrame(rows)


def unit_error_table(ns: list[int], units=UNIT_PANEL, promote_every: int = 128, outputs: tuple[int, int] = (4, 16),
                     seed: int = 0) -> pd.DataFrame:
    """Relative error of a long dot product on each unit against its exact value, by length n, without and
    with promotion into fp32 every ``promote_every`` terms: A (4, n) in [1/8, 2] and B (n, 16) in [0.5, 2],
    positive values of the unit's operand types (block scales in [0.5, 2]), chained along K; the exact
    reference is the float64 GEMM (exact here: every partial sum of these products fits 53 bits). Rows:
    unit, F, n, promoted, rel_error (the largest over the 64 outputs of |D − exact| / exact), x = n · 2^-F."""
    ns = sorted(check_int("ns", n, lo=1) for n in ns)
    rng = np.random.default_rng(seed)
    rows = []
    for arch, instr in units:
        u = instructions.get(arch, instr)
        step = max(u.k, promote_every)
        nmax = -(-ns[-1] // step) * step
        va = tensorcore.operand_values(u.a_type)
        vb = tensorcore.operand_values(u.b_type)
        va, vb = va[(va >= 0.125) & (va <= 2)], vb[(vb >= 0.5) & (vb <= 2)]
        m, n_out = outputs
        a = rng.choice(va, (m, nmax))
        b = rng.choice(vb, (nmax, n_out))
        sa = sb = None
        if u.block:                 # scales of the unit's scale type in [0.5, 2]: they vary the low bits
            vs = tensorcore.operand_values("e4m3") if u.scale_type == "ue4m3" else np.array([0.5, 1.0, 2.0])
            vs = vs[(vs >= 0.5) & (vs <= 2)]
            sa, sb = rng.choice(vs, (m, nmax // u.block)), rng.choice(vs, (nmax // u.block, n_out))
        for promoted in (False, True):
            d = np.zeros((m, n_out), np.float32)
            exact = np.zeros((m, n_out))
            k0 = 0
            for n in ns:
                k1 = -(-n // step) * step
                if k1 > k0:
                    xa, xb = a[:, k0:k1], b[k0:k1]
                    s_a = s_b = None
                    if u.block:
                        s_a, s_b = sa[:, k0 // u.block:k1 // u.block], sb[k0 // u.block:k1 // u.block]
                        xa = xa * np.repeat(s_a, u.block, axis=1)     # exact: powers of two times 4-bit values
                        xb = xb * np.repeat(s_b, u.block, axis=0)
                    d = tensorcore.matmul_unit(u, a[:, k0:k1], b[k0:k1], d, s_a, s_b,
                                               promote_every if promoted else None)
                    exact = exact + xa @ xb
                    k0 = k1
                rows.append({"unit": _label(u), "F": u.frac_bits, "n": k1, "promoted": promoted,
                             "rel_error": float(np.max(np.abs(d - exact) / exact)), "x": k1 * 2.0 ** -u.frac_bits})
    return pd.DataFrame(rows)
