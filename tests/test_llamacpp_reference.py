"""The llama.cpp reference job (kvcost.runs.llamacpp_reference): one interface, the decoder chosen by name,
and what it reads from the GGUF, checked without llama.cpp (numpy, and torch where it is installed)."""
import os
from pathlib import Path

import pytest

from kvcost.models import decoders, window_metrics
from kvcost.paths import repo_root
from kvcost.runs import llamacpp_reference as ref

ROOT = repo_root()


def test_the_model_is_chosen_by_name():
    smol = ref.parse_args([])
    assert smol.model == "smollm2-135m" and smol.out == ROOT / "data" / "real_model" / "llamacpp_windows.csv"
    assert smol.row_chunk == 0                                   # SmolLM2's committed rows: all at once
    gem = ref.parse_args(["--model", "gemma3-270m", "--window", "1", "2", "3"])
    assert gem.out == ROOT / "data" / "real_model" / "gemma3_270m" / "llamacpp_windows.csv"
    assert gem.row_chunk == 256 and gem.window == [1, 2, 3]
    assert set(ref.OUTS) == set(decoders.DECODERS)
    assert ref.parse_args(["--model", "gemma3-270m", "--row-chunk", "0"]).row_chunk == 0
    with pytest.raises(SystemExit):
        ref.parse_args(["--model", "llama-7b"])
    with pytest.raises(SystemExit):
        ref.parse_args(["--model", "gemma3-270m", "--window", "8"])   # 16,384 tokens make windows 0-7 at 2k


def test_rotation_blocks_follow_the_head_size():
    """llama.cpp rotates K in blocks of the largest power of two dividing the head size, V in 64s: SmolLM2's
    64-channel heads whole, Gemma's 256-channel K whole but its V in four blocks (kvcost's '+hadamard' rotates
    V's whole head: the rotated rows of the two engines store V differently on Gemma)."""
    assert ref.cache_types("q8_0/q4_0+hadamard") == ("Q8_0", "Q4_0", True)
    assert ref.cache_types("bf16") == ("BF16", "BF16", False)
    assert ref.rotation_blocks("q4_0+hadamard", 64) == (64, 64)
    assert ref.rotation_blocks("q4_0+hadamard", 256) == (256, 64)
    assert ref.rotation_blocks("q4_0", 256) == (None, None)
    with pytest.raises(ValueError, match="does not rotate"):
        ref.rotation_blocks("q4_0+hadamard", 96)
    for bad in ("fp16+hadamard", "nvfp4", "q4_0@hf", "kivi4"):
        with pytest.raises(ValueError, match=r"not a llama\.cpp cache type"):
            ref.cache_types(bad)


def test_gguf_facts_read_the_metadata():
    gemma = {"general.architecture": "gemma3", "gemma3.embedding_length": "640", "gemma3.attention.head_count": "4",
             "gemma3.attention.key_length": "256", "gemma3.attention.value_length": "256",
             "gemma3.attention.sliding_window": "512", "tokenizer.ggml.add_bos_token": "true"}
    assert ref.gguf_facts(gemma) == {"architecture": "gemma3", "head_dim_k": 256, "head_dim_v": 256,
                                     "add_bos_token": True, "sliding_window": 512}
    llama = {"general.architecture": "llama", "llama.embedding_length": "576", "llama.attention.head_count": "9",
             "tokenizer.ggml.add_bos_token": "false"}
    assert ref.gguf_facts(llama) == {"architecture": "llama", "head_dim_k": 64, "head_dim_v": 64,
                                     "add_bos_token": False, "sliding_window": None}
    with pytest.raises(ValueError, match=r"general\.architecture"):
        ref.gguf_facts({})


def test_tokenization_note():
    assert ref.tokenization_note([1, 2, 3, 4], [1, 2, 3, 9], 3) == {
        "same": True, "first_difference": None, "tokens_compared": 3, "transformers_tokens": 4, "llamacpp_tokens": 4}
    assert ref.tokenization_note([1, 2, 3, 4], [1, 5, 3, 4], 4)["first_difference"] == 1
    assert ref.tokenization_note([1, 2, 3], [1, 2], 3)["first_difference"] == 2


def test_chunked_logit_metrics_are_the_whole_matrix_sums():
    """The llama.cpp job's metrics: token_metrics' sums (its per-token terms, summed in another order: to
    float64 rounding) with one chunk and with several, the references not among the formats asked for; the
    integer counts exactly."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    mats = {f: torch.randn(41, 30, generator=g) for f in ("fp32", "fp16", "q4_0")}
    mats["fp16"] = mats["fp32"] + 1e-3 * mats["fp16"]
    targets = torch.randint(0, 30, (41,), generator=g)
    refs = [torch.log_softmax(mats[r].double(), -1) for r in ("fp32", "fp16")]
    whole = window_metrics.token_metrics(mats["q4_0"], targets, refs)
    one = window_metrics.chunked_logit_metrics(lambda f, s, e: mats[f][s:e], ["q4_0"], targets, rows=41)
    assert list(one) == ["q4_0"]
    q = one["q4_0"]
    assert q["n"] == 41 and q["nll_sum"] == pytest.approx(float(whole["nll"].sum()), rel=1e-13)
    assert q["kl_fp32_sum"] == pytest.approx(float(whole["kl0"].sum()), rel=1e-12) and q["kl_fp32_sum"] > 0.1
    assert q["kl_fp16_sum"] == pytest.approx(float(whole["kl1"].sum()), rel=1e-12)
    assert (q["top1_fp32"], q["top1_fp16"]) == (int(whole["top1_0"].sum()), int(whole["top1_1"].sum()))
    assert q["correct"] == int((whole["argmax"] == targets.numpy()).sum())
    chunked = window_metrics.chunked_logit_metrics(lambda f, s, e: mats[f][s:e], ["fp32", "q4_0"], targets, rows=8)
    assert chunked["q4_0"]["kl_fp32_sum"] == pytest.approx(q["kl_fp32_sum"], rel=1e-12) and q["kl_fp32_sum"] > 0
    assert chunked["q4_0"]["top1_fp16"] == q["top1_fp16"] == int(whole["top1_1"].sum())
    assert chunked["fp32"]["kl_fp32_sum"] == 0.0 and chunked["fp32"]["top1_fp32"] == 41
    with pytest.raises(ValueError, match="'rows'"):
        window_metrics.chunked_logit_metrics(lambda f, s, e: mats[f][s:e], ["q4_0"], targets, rows=0)
    with pytest.raises(ValueError, match="'refs'"):
        window_metrics.chunked_logit_metrics(lambda f, s, e: mats[f][s:e], ["q4_0"], targets, refs=("fp32",))


def test_chunked_logit_metrics_per_token_terms_are_the_definitions():
    """At a real vocabulary's width, with KL small (a stored format's size: 1e-5 to 1e-3 nats), the batched
    reduction gives token_metrics' KL per chunk to 1e-9 of itself, and the stored format that equals its
    reference to the last bit (fp16 here) has KL 0 against it."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(11)
    base = 4 * torch.randn(6, 20000, generator=g)
    mats = {"fp32": base, "fp16": base + 1e-3 * torch.randn(6, 20000, generator=g)}
    mats["q8_0"] = mats["fp16"].clone()
    targets = torch.randint(0, 20000, (6,), generator=g)
    refs = [torch.log_softmax(mats[r].double(), -1) for r in ("fp32", "fp16")]
    whole = window_metrics.token_metrics(mats["fp16"], targets, refs)
    got = window_metrics.chunked_logit_metrics(lambda f, s, e: mats[f][s:e], ["fp16", "q8_0"], targets, rows=4)
    assert 1e-7 < float(whole["kl0"].sum()) < 1e-4
    assert got["fp16"]["kl_fp32_sum"] == pytest.approx(float(whole["kl0"].sum()), rel=1e-9)
    assert got["q8_0"]["kl_fp16_sum"] == 0.0 and got["q8_0"]["top1_fp16"] == 6
    assert got["q8_0"]["kl_fp32_sum"] == got["fp16"]["kl_fp32_sum"]


def test_plain_weight_buffers_wraps_the_default_params_once():
    """Without llama.cpp: the default-params function the Llama constructor calls is wrapped once, to turn the
    extra (AMX, repacked) weight buffers off; everything else it returns is llama.cpp's default."""
    import types

    class Params:
        use_extra_bufts = True
        n_gpu_layers = 7

    low = types.SimpleNamespace(llama_model_default_params=Params)
    fake = types.SimpleNamespace(llama_cpp=low)
    ref.plain_weight_buffers(fake)
    wrapped = low.llama_model_default_params
    p = wrapped()
    assert p.use_extra_bufts is False and p.n_gpu_layers == 7
    ref.plain_weight_buffers(fake)
    assert low.llama_model_default_params is wrapped
    assert ref.parse_args([]).extra_bufts is False and ref.parse_args(["--extra-bufts"]).extra_bufts is True


def test_gemma_against_llamacpp_on_the_same_windows():
    """Gemma 3 270M's committed 2k windows 0-3, kvcost's emulated storage against llama.cpp's own cache on the
    same GGUF, tokens and BOS. Plain q4_0 agrees (KL above llama.cpp's bf16 floor within 10% of ours; Δppl
    within the intervals plus the engines' fp16 gap); q8_0 and K q8_0 / V q4_0 are below the measurable KL
    (2 x llama.cpp's floor) and their Δppl agree. The rotation does not: llama.cpp's default (K in one block of
    256, V in blocks of 64) lowers q4_0's KL on every window, kvcost's '+hadamard' (both whole-head) raises it,
    and the Δppl intervals part."""
    from kvcost.experiments import real_decoder as real

    ours = real.load_windows("gemma3_270m/ppl_windows.csv")
    ours = ours[ours["context"] == 2048]                                  # llama.cpp ran the 2k windows
    theirs = real.load_windows("gemma3_270m/llamacpp_windows.csv")
    theirs = theirs[theirs["context"] == 2048]                          # the 8k window has no pair here
    prov = real.load_provenance("gemma3_270m/llamacpp_windows.json")
    assert prov["model"] == "gemma3-270m" and prov["gguf_sha256"] == decoders.DECODERS["gemma3-270m"].sha256
    assert prov["tokenization"]["same"] and prov["bos"] == {"transformers": 2, "llama.cpp": 2}
    assert prov["settings"]["rotation_blocks"]["q4_0+hadamard"] == [256, 64]
    assert prov["settings"]["use_extra_bufts"] is False and "Gemma Terms of Use" in prov["terms"]
    four = [0, 1, 2, 3]
    comp = real.llamacpp_comparison(ours[ours["window"].isin(four)], theirs[theirs["window"].isin(four)])
    comp = comp.set_index("format")
    assert set(comp["windows"]) == {4}
    assert comp.loc["q4_0", "kl_agrees"] and abs(comp.loc["q4_0", "kl_ratio"] - 1) < 0.1
    for fmt in ("bf16", "q8_0", "q8_0/q4_0", "q4_0"):
        assert comp.loc[fmt, "agrees"], fmt
    for fmt in ("q8_0", "q8_0/q4_0"):
        assert comp.loc[fmt, "kl_agrees"] is None                   # ours is under 2 x llama.cpp's floor
    assert not comp.loc["q4_0+hadamard", "agrees"]
    assert comp.loc["q4_0+hadamard", "llamacpp_hi"] < comp.loc["q4_0+hadamard", "ours_lo"]
    assert 0.10 < comp.loc["q4_0", "floor"] < 0.15                   # the engines' fp16-cache perplexity gap
    kl = {name: df.assign(kl=df["kl_fp32_sum"] / df["n"]).pivot(index="window", columns="format", values="kl").loc[four]
          for name, df in (("ours", ours), ("llama.cpp", theirs))}
    assert (kl["llama.cpp"]["q4_0+hadamard"] < kl["llama.cpp"]["q4_0"]).all()
    assert (kl["ours"]["q4_0+hadamard"] > kl["ours"]["q4_0"]).all()
    assert (kl["llama.cpp"]["q8_0/q4_0+hadamard"] < kl["llama.cpp"]["q8_0/q4_0"]).all()


def test_large_scored_logits_are_kept_on_disk_with_the_same_values(tmp_path, monkeypatch):
    """Gemma's 262,144-token vocabulary makes a window's scored rows 4.3 GB at 8k: past SPILL_BYTES they are kept in
    a memory-mapped file, not RAM, and read back as the same float32 values (so the same metrics)."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    buffer = rng.standard_normal((40, 300)).astype(np.float32)          # llama.cpp's every-position buffer
    rows = buffer[20:39]                                               # the scored half, a view into it
    small = ref.keep_scores(rows, tmp_path, "fp16")
    assert isinstance(small, np.ndarray) and not isinstance(small, np.memmap) and not list(tmp_path.iterdir())
    monkeypatch.setattr(ref, "SPILL_BYTES", 1024)
    big = ref.keep_scores(rows, tmp_path, "q8_0_q4_0")
    assert isinstance(big, np.memmap) and (tmp_path / "q8_0_q4_0.npy").is_file()
    buffer[:] = 0                                                      # the context freed: the copy is its own
    assert np.array_equal(big, small) and big.dtype == np.float32 and big.shape == (19, 300)
    assert np.array_equal(np.load(tmp_path / "q8_0_q4_0.npy"), small)


def test_window_metrics_bench_row_compares_the_two_sums():
    """make bench's window-metrics row at a small size: it times both ways on the same logits and reports how
    closely their KL sums agree (the speed bar is the full size's: not asserted here)."""
    pytest.importorskip("torch")
    from kvcost import bench

    assert bench.bench_window_metrics in bench.BENCHMARKS
    (row,) = bench.bench_window_metrics(rows=6, vocab=3000)
    assert row.case.startswith("window metrics 6 rows x 3,000 vocabulary, 9 formats") and row.bar == 2.0
    assert row.seconds > 0 and row.value > 0
    agree = float(row.note.rsplit("agree to ", 1)[1].split()[0])
    assert agree <= 1e-10


class _FakeLowLevel:
    """llama_cpp's four batch calls, recording what each llama_decode call was given; the logits of a flagged
    token are its position in every column, so a row copied to the wrong place shows."""

    def __init__(self, cols, fail_at=None):
        import numpy as np

        self.np, self.cols, self.fail_at, self.calls, self.freed = np, cols, fail_at, [], 0
        self._rows = None

    def llama_batch_init(self, n_tokens, embd, n_seq_max):
        assert (embd, n_seq_max) == (0, 1)

        class Batch:
            pass

        b = Batch()
        b.n_tokens, b.token, b.pos, b.n_seq_id = 0, [None] * n_tokens, [None] * n_tokens, [None] * n_tokens
        b.seq_id, b.logits = [[None] for _ in range(n_tokens)], [None] * n_tokens
        return b

    def llama_batch_free(self, batch):
        self.freed += 1

    def llama_decode(self, ctx, batch):
        n = batch.n_tokens
        call = {"ctx": ctx, "tokens": batch.token[:n], "pos": batch.pos[:n], "seq": [s[0] for s in batch.seq_id[:n]],
                "n_seq_id": batch.n_seq_id[:n], "flags": [bool(f) for f in batch.logits[:n]]}
        self.calls.append(call)
        if self.fail_at is not None and self.fail_at in call["pos"]:
            return 1
        out = [p for p, f in zip(call["pos"], call["flags"]) if f]
        self._rows = self.np.repeat(self.np.array(out, dtype=self.np.float32)[:, None], self.cols, axis=1)
        return 0

    def llama_get_logits(self, ctx):
        import ctypes

        return self._rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def test_decode_scored_asks_for_the_scored_rows_only_and_places_each(tmp_path, monkeypatch):
    """A window is fed DECODE_CHUNK tokens per llama_decode call at positions 0, 1, …, sequence 0; only positions
    C/2 .. C-2 ask for logits, and each call's rows land at their positions' rows of the buffer (in RAM and on
    disk alike); a failed call names its tokens and the batch is freed either way."""
    np = pytest.importorskip("numpy")
    c, cols = 40, 7
    toks = list(range(100, 100 + c))
    low = _FakeLowLevel(cols)
    out = ref.decode_scored(low, "ctx", toks, c // 2, ref.scored_buffer(c // 2 - 1, cols, tmp_path, "fp32"), chunk=16)
    assert [len(k["tokens"]) for k in low.calls] == [16, 16, 8] and low.freed == 1
    assert [t for k in low.calls for t in k["tokens"]] == toks
    assert [p for k in low.calls for p in k["pos"]] == list(range(c))
    assert all(s == 0 for k in low.calls for s in k["seq"]) and all(n == 1 for k in low.calls for n in k["n_seq_id"])
    flagged = [p for k in low.calls for p, f in zip(k["pos"], k["flags"]) if f]
    assert flagged == list(range(c // 2, c - 1))                      # llm.scores[c//2:c-1] of --logits-all
    assert not any(low.calls[0]["flags"])                              # a call with no scored position asks none
    assert np.array_equal(out[:, 0], np.arange(c // 2, c - 1, dtype=np.float32)) and (out == out[:, :1]).all()
    assert not isinstance(out, np.memmap)
    monkeypatch.setattr(ref, "SPILL_BYTES", 64)
    disk = ref.decode_scored(_FakeLowLevel(cols), "ctx", toks, c // 2,
                             ref.scored_buffer(c // 2 - 1, cols, tmp_path, "q4_0"), chunk=512)
    assert isinstance(disk, np.memmap) and np.array_equal(np.load(tmp_path / "q4_0.npy"), out)
    failing = _FakeLowLevel(cols, fail_at=17)
    with pytest.raises(RuntimeError, match=r"llama_decode returned 1 for tokens 16\.\.31"):
        ref.decode_scored(failing, "ctx", toks, c // 2, ref.scored_buffer(c // 2 - 1, cols, tmp_path, "x"), chunk=16)
    assert failing.freed == 1
    with pytest.raises(ValueError, match="parameter 'first'"):
        ref.decode_scored(low, "ctx", toks, 30, ref.scored_buffer(19, cols, tmp_path, "y"))


def test_a_killed_runs_spill_folder_is_removed_and_a_live_ones_kept(tmp_path):
    """A SIGKILLed run cannot clean up its spill (up to three 17 GB files at 32k): the next run removes the
    folders whose process is gone, and leaves a live process's, another name's and a file alone."""
    import subprocess
    import sys
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"{ref.SPILL_PREFIX}{gone.pid}-abc"
    (dead / "sub").mkdir(parents=True)
    (dead / "fp32.npy").write_bytes(b"x" * 10)
    live = tmp_path / f"{ref.SPILL_PREFIX}{os.getpid()}-def"
    live.mkdir()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        other_live = tmp_path / f"{ref.SPILL_PREFIX}{alive.pid}-ghi"
        other_live.mkdir()
        legacy = tmp_path / f"{ref.SPILL_PREFIX}q1w2e3"        # the name before the pid was in it: unknown owner
        legacy.mkdir()
        plain_file = tmp_path / f"{ref.SPILL_PREFIX}{gone.pid}-file"
        plain_file.write_text("not a folder")
        assert ref.remove_stale_spills(tmp_path) == [dead]
        assert not dead.exists()
        assert live.is_dir() and other_live.is_dir() and legacy.is_dir() and plain_file.is_file()
    finally:
        alive.kill()
        alive.wait()
    assert ref.remove_stale_spills(tmp_path) == [other_live]


def test_sigterm_unwinds_the_spill_folder(tmp_path):
    """Python's default SIGTERM ends the process without running ``finally``: inside terminated_as_exit it
    raises SystemExit(143), so the temporary folder's ``with`` removes it; the handler is restored after."""
    import signal
    import tempfile
    before = signal.getsignal(signal.SIGTERM)
    made = []
    with pytest.raises(SystemExit) as stop, ref.terminated_as_exit(), \
            tempfile.TemporaryDirectory(prefix=ref.SPILL_PREFIX, dir=tmp_path) as spill:
        made.append(Path(spill))
        (Path(spill) / "scores.npy").write_bytes(b"x")
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.value.code == 128 + signal.SIGTERM
    assert made and not made[0].exists()
    assert signal.getsignal(signal.SIGTERM) is before
