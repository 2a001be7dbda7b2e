"""The one storage vocabulary (kvcost.storage.formats registry, kvcost.storage.spec parser, quant.roundtrip)
and the 2026 formats: OCP MX v1.0 rules and hand-computed cases, ml_dtypes' fnuz grid exhaustively,
NVFP4 by hand, and torchao's MX / NVFP4 reference bit for bit where torch and torchao are installed
(``pip install torchao==0.18.0`` next to the ``[real]`` extra's torch)."""
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from kvcost.engines import vllm
from kvcost.models import footprint
from kvcost.storage import CacheSpec, formats, parse_spec, quant
from kvcost.storage import blockfloat as bf
from kvcost.storage import turboquant as tq
from kvcost.storage.spec import llamacpp_rotation

ALL = formats.all_names()
RNG = np.random.default_rng(23)


def _x(shape=(2, 3, 40, 128), spread=2.0) -> np.ndarray:
    """Rows with a per-row magnitude spread (log-normal) so that blocks see different scales."""
    g = RNG.standard_normal(shape) * np.exp(RNG.standard_normal((*shape[:-1], 1)) * spread)
    return g.astype(np.float32)


# ------------------------------------------------------------------ the registry drives the tests

@pytest.mark.parametrize("name", ALL)
def test_every_name_has_one_roundtrip(name: str) -> None:
    x = _x(spread=0.5)
    y = quant.roundtrip(x, name)
    assert y.shape == x.shape and np.isfinite(y).all()
    assert np.array_equal(quant.roundtrip_fn(name)(x), y)
    rel = np.linalg.norm(y - x) / np.linalg.norm(x)
    bits = formats.bits_per_value(name, 128)
    assert rel < (0.5 if bits < 4 else 0.2), (name, rel)           # a storage format, not noise
    if formats.get(name).family == "float" or name == "fp32":
        assert rel < 4e-3


@pytest.mark.parametrize("name, per_hd", [
    # the CONTRACT's bytes per hd values of one token and one KV head (hd = 128)
    ("nvfp4", 128 // 2 + 128 // 16), ("nvfp4_4over6", 128 // 2 + 128 // 16), ("mxfp4", 128 // 2 + 128 // 32),
    ("fp4_mx_block16", 128 // 2 + 128 // 16), ("mxfp8", 128 + 128 // 32), ("fp8_e4m3fnuz", 128),
    ("int8_per_token_head", 128 + 4), ("int4_per_token_head", 128 // 2 + 4), ("fp8_per_token_head", 128 + 4),
    # TurboQuant: one slot of K and V per token and head, counted half to K and half to V
    ("turboquant_k8v4", 196 // 2), ("turboquant_4bit_nc", 134 // 2), ("turboquant_k3v4_nc", 118 // 2),
    ("turboquant_3bit_nc", 102 // 2),
])
def test_cache_bytes_of_the_2026_formats(name: str, per_hd: int) -> None:
    g = footprint.from_hf_config({"num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "hidden_size": 512, "head_dim": 128})
    assert footprint.cache_bytes(g, 1000, dtype=name) == 3 * 2 * 2 * per_hd * 1000      # layers x K,V x heads
    assert footprint.cache_bytes(g, 1000, dtype="bf16", v_dtype=name) == 3 * 2 * 1000 * (2 * 128 + per_hd)
    assert formats.row_bytes(name, 128, head_dim=128) == per_hd


def test_bits_per_value_and_layout_facts() -> None:
    assert formats.bits_per_value("nvfp4") == 4.5 and formats.bits_per_value("mxfp4") == 4.25
    assert formats.bits_per_value("fp4_mx_block16") == 4.5 and formats.bits_per_value("mxfp8") == 8.25
    assert formats.bits_per_value("int8_per_token_head", 128) == 8.25
    assert formats.bits_per_value("int4_per_token_head", 64) == 4.5
    f = formats.get("nvfp4")
    assert (f.block, f.element, f.scale_format, f.family) == (16, "float4_e2m1fn", "float8_e4m3fn", "nvfp4")
    m = formats.get("mxfp8")
    assert (m.block, m.element, m.scale_format, m.block_bytes) == (32, "float8_e4m3fn", "float8_e8m0fnu", 33)
    assert formats.get("fp8_e4m3fnuz").element == "float8_e4m3fnuz"
    assert formats.get("fp8_e4m3").element == "float8_e4m3fn"


def test_engine_names_translate_both_ways() -> None:
    assert formats.engine_name("nvfp4", "vllm") == "nvfp4" and formats.engine_name("q8_0", "vllm") is None
    assert formats.engine_name("fp16", "llama.cpp") == "f16" and formats.engine_name("mxfp8", "sglang") == "mxfp8"
    assert formats.from_engine("fp8_per_token_head", "vllm").name == "fp8_e4m3_token"
    assert formats.from_engine("int4_per_token_head", "vllm").name == "int4_token"
    assert formats.get("int8_per_token_head").name == "int8_token"
    assert ("vllm", "nvfp4_4over6") in formats.get("nvfp4_4over6").engines
    with pytest.raises(ValueError, match="'engine'"):
        formats.engine_name("q8_0", "tgi")
    with pytest.raises(ValueError, match="vllm has no KV cache dtype 'q4_0'"):
        formats.from_engine("q4_0", "vllm")
    # every engine name resolves to a registry format with a round trip, or to one of vLLM's MLA records
    for table in formats.ENGINES.values():
        for name in table.values():
            assert name in ALL or formats.get(name).family == "mla_record", name
    # SGLang's own spellings (server_args.py @ 001067ff), fp4_e2m1 refused in SGLang's words
    assert sorted(formats.ENGINES["sglang"]) == ["bf16", "bfloat16", "fp4_mx_block16", "fp8_e4m3", "fp8_e5m2",
                                                 "mxfp8", "nvfp4"]
    assert formats.from_engine("fp4_mx_block16", "sglang").name == "fp4_mx_block16"
    assert formats.engine_name("fp4_mx_block16", "sglang") == "fp4_mx_block16"
    with pytest.raises(ValueError, match=r"'fp4_e2m1' maps to no format.*'--kv-cache-dtype=fp4_e2m1 is deprecated\. "
                                         r"Use --kv-cache-dtype=fp4_mx_block16\.'"):
        formats.from_engine("fp4_e2m1", "sglang")
    with pytest.raises(ValueError, match="sglang has no KV cache dtype 'mxfp4'"):
        formats.from_engine("mxfp4", "sglang")
    with pytest.raises(ValueError, match=r"SGLang --kv-cache-dtype fp4_e2m1 is known to kvcost but not modelled.*"
                                         r"0\.5\.23 release no longer offers it.*values kvcost models: bf16, "):
        formats.get("fp4_e2m1")
    # vLLM 0.33.0's CacheDType names kvcost knows and does not model (ROCm Octave and UltraQuant caches)
    assert sorted(formats.ENGINE_UNMODELLED["vllm"]) == ["octave_k3v3", "octave_k3v3_compact", "octave_k3v4",
                                                         "ultraquant_4bit"]
    for name in formats.ENGINE_UNMODELLED["vllm"]:
        assert name not in formats.ENGINES["vllm"]
        with pytest.raises(ValueError, match=rf"^vLLM --kv-cache-dtype {name} is known to kvcost but not modelled: "
                                             r"vLLM 0\.33\.0's ROCm .*values kvcost models: bfloat16, float16, fp8, "):
            formats.get(name)
        with pytest.raises(ValueError, match=rf"'{name}' maps to no format \(known, not modelled\)"):
            formats.from_engine(name, "vllm")
    with pytest.raises(ValueError, match=r"UltraQuant.*2\^round\(log2\(0\.156 max\)\) per 32"):
        formats.get("ultraquant_4bit")


def test_the_e4m3_ambiguity_is_gone() -> None:
    # kvcost.floats: eXmY e4m3 is IEEE-style (max 240); as a storage name it is refused with the choices
    with pytest.raises(ValueError, match=r"ambiguous.*fp8_e4m3.*float8_e4m3fn.*fp8_e4m3fnuz"):
        formats.get("e4m3")
    with pytest.raises(ValueError, match=r"'dtype'.*ambiguous"):
        footprint.cache_bytes(footprint.load_model("Llama-3.1-8B"), 16, "e4m3")
    assert formats.get("float8_e4m3fn").name == formats.get("fp8_e4m3fn").name == "fp8_e4m3"
    assert formats.get("float8_e4m3fnuz").name == "fp8_e4m3fnuz"
    # quant's fp8 element names are FlashAttention-3's: e4m3 is OCP E4M3FN (448)
    assert quant.fp8_roundtrip(np.array([[1000.0]]), "e4m3", scale=1.0)[0, 0] == 448.0
    with pytest.raises(ValueError, match="e4m3fnuz"):
        quant.fp8_roundtrip(np.ones((1, 1)), "e4m3fnuz")


def test_exact_is_the_one_no_storage_name() -> None:
    x = np.linspace(-3, 3, 64).reshape(2, 32)
    assert np.array_equal(quant.roundtrip(x, "exact"), x) and np.array_equal(quant.roundtrip(x, "none"), x)
    assert formats.get("none").name == "exact"


# ------------------------------------------------------------------ the spec parser

@pytest.mark.parametrize("text, k, v, rot, order, skips", [
    ("q4_0", "q4_0", "q4_0", None, None, ()),
    ("q8_0/q4_0+hadamard@hf", "q8_0", "q4_0", "hadamard", "hf", ()),
    ("fp8/q4_0", "fp8_e4m3", "q4_0", None, None, ()),
    ("nvfp4;skip=sliding_window,0", "nvfp4", "nvfp4", None, None, ("sliding_window", "0")),
    ("store:mxfp4+hadamard", "mxfp4", "mxfp4", "hadamard", None, ()),
    ("FP8_PER_TOKEN_HEAD", "fp8_e4m3_token", "fp8_e4m3_token", None, None, ()),
])
def test_parse_spec(text: str, k: str, v: str, rot: str | None, order: str | None, skips: tuple) -> None:
    s = parse_spec(text)
    assert (s.k, s.v, s.rotation, s.k_order, s.skip_layers) == (k, v, rot, order, skips)
    assert parse_spec(s.label) == s and parse_spec(s) is s


def test_spec_labels_and_layers() -> None:
    assert parse_spec("q8_0/q4_0+hadamard@hf").label == "q8_0/q4_0+hadamard@hf"
    assert parse_spec("q8_0").kv_label == "q8_0/q8_0" and parse_spec("q8_0/q4_0").base == "q8_0/q4_0"
    s = parse_spec("nvfp4;skip=sliding_window,3;skip_dtype=fp16")
    assert s.label == "nvfp4;skip=sliding_window,3;skip_dtype=fp16"
    assert s.layer_formats(3, "full") == ("fp16", "fp16") and s.layer_formats(1, "sliding") == ("fp16", "fp16")
    assert s.layer_formats(1, "full") == ("nvfp4", "nvfp4")
    assert parse_spec("q8_0", "q4_0").v == "q4_0"
    assert parse_spec("store:q4_0").store and not parse_spec("store:q4_0").without_store().store


@pytest.mark.parametrize("bad, match", [
    ("q9_0", "'dtype'"), ("q4_0+had", "'dtype' must be a storage spec"), ("q4_0@xx", "channel order"),
    ("bf16@hf", "same values in either order"), ("nvfp4;skip=full", "skip list"), ("q4_0;foo=1", "unknown option"),
    ("q4_0;skip_dtype=fp16", "without a skip list"), ("e4m3", "ambiguous"), (7, "'dtype' must be"),
])
def test_parse_spec_errors_name_the_parameter(bad: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_spec(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"'v_dtype'.*contradicts"):
        parse_spec("q8_0/q4_0", "q5_0")


def test_roundtrip_of_specs() -> None:
    x = _x((4, 64))
    assert np.array_equal(quant.roundtrip(x, "nvfp4+hadamard"),
                          quant.rotated_roundtrip(x, lambda y: quant.roundtrip(y, "nvfp4")))
    assert np.array_equal(quant.roundtrip(x, "q8_0/q4_0", role="k"), quant.ggml_roundtrip(x, "q8_0"))
    assert np.array_equal(quant.roundtrip(x, "q8_0/q4_0"), quant.ggml_roundtrip(x, "q4_0"))
    with pytest.raises(ValueError, match="skip"):
        quant.roundtrip(x, "nvfp4;skip=sliding_window")
    with pytest.raises(ValueError, match="channel order"):
        quant.roundtrip(x, "q4_0@hf")
    with pytest.raises(ValueError, match="'role'"):
        quant.roundtrip(x, "q4_0", role="q")
    k, v = quant.store_kv(x, x, "mxfp4/nvfp4")
    assert np.array_equal(k, bf.mx_roundtrip(x, "float4_e2m1fn", 32)) and np.array_equal(v, bf.nvfp4_roundtrip(x))


def test_sizing_skips_layers_as_vllm_does() -> None:
    g = footprint.load_model("gemma-3-27b")
    plain = {r["kind"]: r for r in footprint.layer_breakdown(g, 65536, "nvfp4")}
    bf16 = {r["kind"]: r for r in footprint.layer_breakdown(g, 65536, "bf16")}
    rows = footprint.layer_breakdown(g, 65536, "nvfp4;skip=sliding_window")
    assert [(r["kind"], r["k_format"]) for r in rows] == [("full", "nvfp4"), ("sliding", "bf16")]
    want = plain["full"]["k_bytes"] * 2 + bf16["sliding"]["k_bytes"] * 2
    assert footprint.cache_bytes(g, 65536, "nvfp4;skip=sliding_window") == want
    p = footprint.plan(g, 65536, "nvfp4;skip=sliding_window", budget_gib=10.0)
    assert p.cache_bytes == want and p.skip_layers == ("sliding_window",) and p.dtype == "nvfp4"
    # layer 0 alone in bf16 (an index), the rest nvfp4
    one = footprint.layer_breakdown(g, 100, "nvfp4;skip=0")
    assert sum(r["layers"] for r in one) == g.kv_layers and one[-1]["layers"] == 1 and one[-1]["k_format"] == "bf16"


def test_vllm_pages_of_the_2026_formats() -> None:
    g = footprint.load_model("Llama-3.1-8B")                       # 8 KV heads x 128
    per = {"nvfp4": 2 * (64 + 8), "nvfp4_4over6": 2 * (64 + 8), "int8_per_token_head": 2 * (128 + 4),
           "fp8_per_token_head": 2 * (128 + 4), "int4_per_token_head": 2 * (64 + 4), "fp8": 2 * 128, "auto": 2 * 256}
    for dt, b in per.items():
        assert vllm.page_bytes(g, 16, 1, dt) == 16 * 8 * b, dt
    # vLLM's per-token-head page (kv_cache_interface.py): data plus 2 x block x heads x fp32 scales
    assert vllm.page_bytes(g, 16, 1, "int8_per_token_head") == 2 * 16 * 8 * 128 + 2 * 16 * 8 * 4
    with pytest.raises(ValueError, match="--kv-cache-dtype"):
        vllm.page_bytes(g, 16, 1, "q4_0")


# ------------------------------------------------------------------ OCP MX v1.0, by hand

def test_mxfp4_hand_computed_block() -> None:
    x = np.zeros((1, 64), dtype=np.float32)
    # block 0: max 7 -> floor(log2 7) - 2 = 0, scale 1; E2M1 ties to even, 7 saturates to 6
    x[0, :9] = [7.0, 5.0, 0.25, 0.26, -0.75, 3.3, 2.5, 1.25, -0.0]
    # block 1: max 0.7 -> floor(log2 0.7) - 2 = -3, scale 1/8: 0.7 * 8 = 5.6 -> 6 -> 0.75; 0.1 * 8 = 0.8 -> 1
    x[0, 32:34] = [0.7, 0.1]
    q = bf.mx_quantize(x, "float4_e2m1fn", 32)
    assert list(q.scale[0]) == [127, 124]
    assert q.scale_e8m0.astype(np.float32)[0].tolist() == [1.0, 0.125]
    y = bf.mx_roundtrip(x)
    assert y[0, :9].tolist() == [6.0, 4.0, 0.0, 0.5, -1.0, 3.0, 2.0, 1.0, 0.0]
    assert y[0, 32:34].tolist() == [0.75, 0.125]
    assert np.array_equal(quant.roundtrip(x, "mxfp4"), y)


def test_mx_zero_block_and_scale_range() -> None:
    z = np.zeros((2, 32), dtype=np.float32)
    q = bf.mx_quantize(z)
    assert (q.scale == 0).all() and np.array_equal(bf.mx_dequantize(q), z)       # 2^-127, zeros
    big = np.full((1, 32), 3e38, dtype=np.float32)
    assert bf.mx_quantize(big).scale[0, 0] == 127 + 127 - 2                       # floor(log2 3e38) = 127
    assert np.isfinite(bf.mx_roundtrip(big)).all()


def test_ocp_mxfp8_saturates_and_rounds_to_nearest_even() -> None:
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, :4] = [1000.0, 2.0 * 1.0625, 2.0 * 1.0625 + 1e-3, -3.0]          # scale 2^(9-8) = 2
    y = bf.mx_roundtrip(x, "float8_e4m3fn", 32)
    assert y[0, :4].tolist() == [896.0, 2.0, 2.25, -3.0]                  # 500 -> 448; tie 1.0625 -> 1.0
    # the registry's mxfp8 is SGLang's: ceil(log2(1000 / 448)) = 2, scale 4: 250 -> 256 (nothing saturates),
    # 0.53125 ties to 0.5 (even), -0.75 exact
    assert quant.roundtrip(x, "mxfp8")[0, :4].tolist() == [1024.0, 2.0, 2.25, -3.0]


def test_mx_follows_the_ocp_rule_on_random_blocks() -> None:
    """Scale = 2^(floor(log2 amax) - emax_elem), elements nearest-even saturated (checked against an
    independent construction from the element type's value table)."""
    x = _x((16, 128), spread=3.0)
    for element, emax, block, table_top in (("float4_e2m1fn", 2, 32, 6.0), ("float8_e4m3fn", 8, 32, 448.0),
                                            ("float4_e2m1fn", 2, 16, 6.0)):
        dtype = bf.ELEMENTS[element][0]
        codes = np.arange(256 if "float8" in element else 16, dtype=np.uint8).view(dtype).astype(np.float64)
        grid = np.unique(codes[np.isfinite(codes)])
        xb = x.reshape(16, -1, block).astype(np.float64)
        e = np.floor(np.log2(np.abs(xb).max(axis=-1))) - emax
        t = np.clip(xb / 2.0 ** e[..., None], -table_top, table_top)
        i = np.clip(np.searchsorted(grid, t), 1, len(grid) - 1)
        lo, hi = grid[i - 1], grid[i]
        pick = np.where(t - lo < hi - t, lo, np.where(t - lo > hi - t, hi, 0))
        tie = (t - lo) == (hi - t)
        if tie.any():    # ties: the even code (its last mantissa bit 0)
            lo_even = (np.array(lo, dtype=np.float32).astype(dtype).view(np.uint8) & 1) == 0
            pick = np.where(tie, np.where(lo_even, lo, hi), pick)
        pick = np.where(np.isin(t, grid), t, pick)
        want = (pick * 2.0 ** e[..., None]).reshape(x.shape)
        assert np.array_equal(bf.mx_roundtrip(x, element, block).astype(np.float64), want), element


# ------------------------------------------------------------ SGLang's fp4_mx_block16 (kvfp4_tensor.py @ 0dae407b)

def test_fp4_mx_block16_is_sglangs_recipe_not_ocps() -> None:
    f = formats.get("fp4_mx_block16")
    assert (f.family, f.recipe, f.block, f.block_bytes, f.scale_format) == ("mx", "sglang", 16, 9, "float8_e8m0fnu")
    assert formats.get("mxfp4").recipe == "ocp" and formats.get("mxfp8").recipe == "sglang"
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, :5] = [3.5, 1.25, 2.5, 0.25, -0.1]      # block 0: max 3.5 -> ceil(log2(3.5 / 6)) = 0, scale 1
    x[0, 16:20] = [7.0, 1.25, 2.5, 0.25]          # block 1: max 7 -> ceil(log2(7 / 6)) = 1, scale 2
    q = bf.mx_quantize(x, "float4_e2m1fn", 16, recipe="sglang")
    assert q.scale.tolist() == [[127, 128]]
    y = quant.roundtrip(x, "fp4_mx_block16")
    assert np.array_equal(y, bf.mx_roundtrip(x, "float4_e2m1fn", 16, recipe="sglang"))
    # ties away from zero (3.5 -> 4, 1.25 -> 1.5, 2.5 -> 3, 0.25 -> 0.5), -0.1 -> -0 (sign bit set)
    assert y[0, :5].tolist() == [4.0, 1.5, 3.0, 0.5, 0.0] and np.signbit(y[0, 4])
    # no saturation: 7 / 2 = 3.5 -> 4 -> 8 (OCP clips to 6); 1.25 / 2 = 0.625 -> 0.5 -> 1; 0.25 / 2 -> 0
    assert y[0, 16:20].tolist() == [8.0, 1.0, 3.0, 0.0]
    # the OCP rule on the same blocks: scale 1/2 and 1 (floor(log2 max) - 2), ties to even, 7 saturates to 6
    ocp = bf.mx_roundtrip(x, "float4_e2m1fn", 16)
    assert ocp[0, :4].tolist() == [3.0, 1.0, 2.0, 0.25] and ocp[0, 16:20].tolist() == [6.0, 1.0, 2.0, 0.0]
    # an all-zero block: exponent ceil(log2(1e-10)) = -33, byte 94, zeros
    z = bf.mx_quantize(np.zeros((1, 16), np.float32), "float4_e2m1fn", 16, recipe="sglang")
    assert z.scale.tolist() == [[94]] and not bf.mx_dequantize(z).any()
    with pytest.raises(ValueError, match="'recipe'"):
        bf.mx_quantize(x, recipe="torchao")
    with pytest.raises(ValueError, match=r"E2M1.*E4M3"):
        bf.mx_quantize(x, "float8_e5m2", 16, recipe="sglang")


def test_fp4_mx_block16_against_an_independent_construction() -> None:
    """SGLang's rule stated from scratch in float64 (exponent = ceil(log2(max(amax / 6, 1e-10))) taken in float32,
    the code = the count of thresholds reached), and how far it is from the OCP rule on Gaussian data."""
    x = RNG.standard_normal((4096, 128)).astype(np.float32)
    xb = x.reshape(4096, 8, 16)
    e = np.ceil(np.log2(np.maximum(np.abs(xb).max(axis=-1) / np.float32(6), np.float32(1e-10)))).astype(np.float64)
    t = xb / 2.0 ** e[..., None]
    table = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    code = (np.abs(t)[..., None] >= np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5])).sum(axis=-1)
    want = (np.where(t < 0, -1.0, 1.0) * table[code] * 2.0 ** e[..., None]).reshape(x.shape)
    got = quant.roundtrip(x, "fp4_mx_block16")
    assert np.array_equal(got.astype(np.float64), want)
    assert np.abs(t).max() <= 6.0                                        # nothing clipped
    ocp = bf.mx_roundtrip(x, "float4_e2m1fn", 16)
    differ = float((got != ocp).mean())
    mse_sglang, mse_ocp = float(((got - x) ** 2).mean()), float(((ocp - x) ** 2).mean())
    assert 0.09 < differ < 0.12                                          # the research's 10.4 % (another seed)
    assert mse_sglang == pytest.approx(0.0128, abs=6e-4) and mse_ocp == pytest.approx(0.0139, abs=6e-4)
    assert mse_sglang < mse_ocp


def test_fp4_mx_block16_matches_sglangs_torch_operations_bit_for_bit() -> None:
    """SGLang's batched_quantize / batched_dequantize operations (kvfp4_tensor.py @ 0dae407b) in eager torch float32:
    clamp(max / 6, 1e-10) -> log2 -> ceil, the byte exponent + 127, x / exp2(e), the count of bounds reached, the
    packed nibbles, and the read-back table x exp2(byte - 127) cast to bf16."""
    torch = pytest.importorskip("torch")
    x = np.ascontiguousarray(_tie_rows()[:, :128])
    x[5, :16] = np.array([6.0, 3.0, 12.0, 5.0, 2.5, 0.75, 1.75, 0.25] * 2, dtype=np.float32) * np.float32(2.0 ** -3)
    x[6, :3] = [-0.0, -1e-3, 1e-3]                # an input -0 reads +0, a negative rounded to zero reads -0
    t = torch.from_numpy(x).view(1, x.shape[0], x.shape[1])
    blocks = t.view(1, -1, 16)
    exp = torch.ceil(torch.log2(torch.clamp(blocks.abs().max(dim=-1, keepdim=True).values / 6.0, min=1e-10)))
    scale_bytes = (exp + 127).squeeze(-1).to(torch.uint8)
    scaled = blocks / torch.exp2(exp)
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    codes = ((scaled < 0).to(torch.uint8) << 3) + (scaled.abs().unsqueeze(-1) >= bounds).sum(dim=-1).to(torch.uint8)
    codes = codes.view(1, x.shape[0], x.shape[1])
    packed = (codes[..., 1::2] << 4) + codes[..., 0::2]
    unpacked = torch.empty_like(codes)
    unpacked[..., 0::2], unpacked[..., 1::2] = packed & 0x0F, (packed >> 4) & 0x0F
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    back = (values[unpacked.long()].view(1, -1, 16) * torch.exp2(scale_bytes.float() - 127).unsqueeze(-1))
    back = back.view(x.shape).to(torch.bfloat16).float().numpy()
    ours = bf.mx_quantize(x, "float4_e2m1fn", 16, recipe="sglang")
    assert np.array_equal(scale_bytes.numpy().reshape(ours.scale.shape), ours.scale)
    got = bf.mx_dequantize(ours)
    assert np.array_equal(back, got) and np.array_equal(np.signbit(back), np.signbit(got))


# ------------------------------------- SGLang's mxfp8 (SGLang 0.5.23: mxfp8_quant_store_kv.py, mxfp8_quant.py)

def _sglang_mxfp8_hard_blocks() -> np.ndarray:
    """One block of 32 per row: the cases where SGLang's ceiling rule and OCP's floor rule part or meet."""
    f = np.float32
    x = np.zeros((9, 32), dtype=f)
    x[0, :6] = [56.0, -28.0, 0.003 * 0.125, 2.0 ** -13, 3 * 2.0 ** -13, 1.0]   # max 448 x 2^-3: e = -3 (both)
    x[1, :3] = [62.5, 0.3, 2.0 ** -12]                # max 500 x 2^-3: SGLang e = -2, OCP e = -3 (saturates)
    x[2] = 0.0                                        # all zero: SGLang byte 19, OCP 0
    x[3, :3] = [1e-35, -5e-36, 0.0]                   # max below 1e-30: floored, byte 19
    x[4, :2] = [np.nextafter(f(448 * 2.0 ** -20), f(1)), 1e-7]   # float32 log2 rounds to -20: the clamp to 448
    x[5, :4] = [-0.0, -1e-9, 1.0, -448.0]             # -0 kept, a negative rounded to zero reads -0
    x[6, :2] = [1e-40, -3e-41]                        # float32 subnormals: zeros, signs kept
    x[7] = 3e38                                       # the top of float32: byte 247
    x[8] = np.linspace(-7.9, 7.9, 32)
    return x


def _sglang_mxfp8_restated(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SGLang's mxfp8 rule stated from scratch: r = max(amax, 1e-30) / 448 in float32, its log2 correctly rounded
    to float32 (through float64), ceil, + 127 clamped to [0, 254]; x / 2^e in float64 (exact), clamped to +-448,
    the nearest E4M3 value from its table, ties to the even code. Returns (scale bytes, read-back)."""
    xb = x.reshape(*x.shape[:-1], -1, 32).astype(np.float64)
    r = (np.maximum(np.abs(xb).max(axis=-1).astype(np.float32), np.float32(1e-30)) / np.float32(448)).astype(
        np.float32)
    e = np.clip(np.ceil(np.log2(r.astype(np.float64)).astype(np.float32).astype(np.float64)) + 127, 0, 254) - 127
    t = np.clip(xb / 2.0 ** e[..., None], -448.0, 448.0)
    codes = np.arange(256, dtype=np.uint8)
    vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    ok = np.isfinite(vals) & (vals >= 0)
    grid, grid_codes = vals[ok], codes[ok]
    order = np.argsort(grid)
    grid, grid_codes = grid[order], grid_codes[order]
    grid, first = np.unique(grid, return_index=True)
    grid_codes = grid_codes[first]
    m = np.abs(t)
    i = np.clip(np.searchsorted(grid, m), 1, len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    pick = np.where(m - lo < hi - m, lo, hi)
    tie = (m - lo) == (hi - m)
    pick = np.where(tie, np.where(grid_codes[i - 1] % 2 == 0, lo, hi), pick)
    pick = np.where(m <= grid[0], grid[0], pick)
    q = np.copysign(pick, t)
    return (e + 127).astype(np.uint8), (q * 2.0 ** e[..., None]).reshape(x.shape)


def test_mxfp8_is_sglangs_recipe_on_hard_blocks() -> None:
    f = formats.get("mxfp8")
    assert (f.family, f.recipe, f.block, f.block_bytes, f.scale_format) == ("mx", "sglang", 32, 33, "float8_e8m0fnu")
    assert "SGLang mxfp8" in f.description and "OCP MXFP8" in f.description
    x = _sglang_mxfp8_hard_blocks()
    q = bf.mx_quantize(x, "float8_e4m3fn", 32, recipe="sglang")
    ocp = bf.mx_quantize(x, "float8_e4m3fn", 32)
    assert q.scale[:, 0].tolist() == [124, 125, 19, 19, 107, 127, 19, 247, 122]
    assert ocp.scale[:, 0].tolist() == [124, 124, 0, 2, 107, 127, 0, 246, 121]
    y, yo = bf.mx_dequantize(q), bf.mx_dequantize(ocp)
    assert np.array_equal(y, quant.roundtrip(x, "mxfp8"))
    # 448 x 2^-3 maps to 448 under both rules; e4m3 subnormals round to nearest even (2^-10 -> 0, 3 x 2^-10 -> 2^-8)
    assert y[0, :6].tolist() == yo[0, :6].tolist() == [56.0, -28.0, 2.0 ** -11, 0.0, 2.0 ** -11, 1.0]
    # a binade apart, the two rules differ only at the top and the bottom: 62.5 / 2^-2 = 250 -> 256: 64 (OCP
    # saturates 500 to 448: 56); 0.3 reads 0.3125 under both; 2^-12 / 2^-2 = 2^-10 ties to 0 (OCP: 2^-9, kept)
    assert y[1, :3].tolist() == [64.0, 0.3125, 0.0] and yo[1, :3].tolist() == [56.0, 0.3125, 2.0 ** -12]
    assert not y[2].any() and not yo[2].any()
    assert y[3, :2].tolist() == [2.0 ** -108 * 2.0 ** -9 * 2, -(2.0 ** -108) * 2.0 ** -9 * 1]
    # the maximum / 2^-20 is just above 448: clamped, read back 448 x 2^-20 (the exact-ceil rule would take 2^-19)
    assert y[4, 0] == np.float32(448 * 2.0 ** -20) < x[4, 0]
    assert np.signbit(y[5, :2]).all() and y[5, 2:4].tolist() == [1.0, -448.0]
    assert not y[6].any() and np.signbit(y[6, 1]) and yo[6, 0] > 0
    assert np.isfinite(y[7]).all()
    # max 7.9 in (448, 512) x 2^-6: SGLang 2^-5, OCP 2^-6; only the values above 7 = 448 x 2^-6 differ
    assert y[8, [0, 1, -2, -1]].tolist() == [-8.0, -7.5, 7.5, 8.0] and yo[8, [0, -1]].tolist() == [-7.0, 7.0]
    assert np.array_equal(y[8] != yo[8], np.abs(x[8]) > 7)
    with pytest.raises(ValueError, match="'recipe'"):
        bf.mx_quantize(x, "float8_e4m3fn", 32, recipe="torchao")


def test_mxfp8_against_an_independent_restatement_of_sglangs_kernels() -> None:
    """The hard blocks and Gaussian data (bf16-rounded, as SGLang's cache writes see it) against
    :func:`_sglang_mxfp8_restated`, scales and values bit for bit, signs included; how far OCP MXFP8 is."""
    g = (RNG.standard_normal((8192, 32)) * np.exp(RNG.uniform(-6, 6, (8192, 1)))).astype(np.float32)
    x = np.concatenate([_sglang_mxfp8_hard_blocks(), g, g.astype(ml_dtypes.bfloat16).astype(np.float32)])
    q = bf.mx_quantize(x, "float8_e4m3fn", 32, recipe="sglang")
    scale, want = _sglang_mxfp8_restated(x)
    got = bf.mx_dequantize(q)
    assert np.array_equal(q.scale, scale)
    assert np.array_equal(got.astype(np.float64), want) and np.array_equal(np.signbit(got), np.signbit(want))
    part = (bf.mx_quantize(g, "float8_e4m3fn", 32).scale != bf.mx_quantize(g, "float8_e4m3fn", 32,
                                                                             recipe="sglang").scale).mean()
    assert 0.15 < float(part) < 0.25          # blocks whose maximum is in (448, 512) x 2^k: a binade apart


# ------------------------------------------------------------------ fp8 e4m3fnuz (MI300)

def test_fnuz_grid_exhaustively() -> None:
    vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fnuz).astype(np.float64)
    assert np.isnan(vals[0x80]) and np.isnan(vals).sum() == 1            # one NaN, no -0
    grid = np.unique(vals[np.isfinite(vals)])
    assert grid.max() == 240.0 and grid[grid > 0].min() == 2.0 ** -10
    mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)
    assert np.array_equal(mids.astype(np.float64), (grid[:-1] + grid[1:]) / 2)   # exact in float32
    up = np.nextafter(mids, np.float32(np.inf))
    got = quant.roundtrip(up, "fp8_e4m3fnuz")
    assert np.array_equal(got, grid[1:].astype(np.float32))              # just above a midpoint: up
    at = quant.roundtrip(mids, "fp8_e4m3fnuz").astype(np.float64)
    lo_code = grid[:-1].astype(np.float32).astype(ml_dtypes.float8_e4m3fnuz).view(np.uint8)
    even_lo = (lo_code & 1) == 0
    assert np.array_equal(at, np.where(even_lo, grid[:-1], grid[1:]))     # ties to even
    assert quant.roundtrip(np.float32([1e6, -1e6, -0.0]), "fp8_e4m3fnuz").tolist() == [240.0, -240.0, 0.0]
    assert not np.signbit(quant.roundtrip(np.float32([-1e-9]), "fp8_e4m3fnuz")).any()  # no -0


def test_fnuz_bytes_read_as_fn_double_the_value() -> None:
    # vLLM PR #45720's bug: the same byte is 2x in e4m3fn (bias 7) as in e4m3fnuz (bias 8)
    b = np.float32([1.0, 0.375, 224.0, 240.0]).astype(ml_dtypes.float8_e4m3fnuz).view(np.uint8)
    as_fn = b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert as_fn[:3].tolist() == [2.0, 0.75, 448.0] and np.isnan(as_fn[3])        # fnuz's max is fn's NaN


def test_fnuz_scaled_variants() -> None:
    x = _x((3, 8, 64))
    y = quant.roundtrip(x, "fp8_e4m3fnuz_token")
    s = np.abs(x).max(axis=-1, keepdims=True) / np.float32(240)
    assert np.abs(y).max() <= np.abs(x).max() * (1 + 2 ** -4)
    assert np.array_equal(y, bf.cast_element((x / s).astype(np.float32), "float8_e4m3fnuz") * s)


# ------------------------------------------------------------------ NVFP4, by hand

def test_nvfp4_hand_computed() -> None:
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, :3] = [6.0, 3.0, 1.0]              # block max 6 with tensor amax 6 * 448: block scale 1, exact
    x[0, 16:18] = [1.0, 0.5]                # block max 1: scale 1/6 -> e4m3 0.171875; 1/0.171875 = 5.82 -> 6
    for recipe in bf.NVFP4_RECIPES:
        q = bf.nvfp4_quantize(x, tensor_amax=6 * 448, recipe=recipe)
        assert q.scale[0].tolist() == [1.0, 0.171875], recipe
        y = bf.nvfp4_dequantize(q)
        assert y[0, :3].tolist() == [6.0, 3.0, 1.0]
        assert y[0, 16:18].tolist() == [6 * 0.171875, 3 * 0.171875]         # 0.5 / 0.171875 = 2.9 -> 3
        # 4over6: max/4 = 0.25 stores this block exactly, with a smaller squared error
        y46 = bf.nvfp4_roundtrip(x, tensor_amax=6 * 448, recipe=recipe, four_over_six=True)
        assert y46[0, 16:18].tolist() == [1.0, 0.5] and y46[0, :3].tolist() == [6.0, 3.0, 1.0]


def test_nvfp4_recipes_agree_to_a_rounding() -> None:
    x = _x((8, 256), spread=2.0)
    qa = bf.nvfp4_quantize(x, recipe="torchao")
    qb = bf.nvfp4_quantize(x, recipe="compressed-tensors")
    # the same block scales and codes here; the read-back multiplier is ts * s (torchao) or s / global
    # (compressed-tensors), each rounded once in float32: the values differ by at most about one ulp
    assert np.array_equal(qa.scale, qb.scale) and np.array_equal(qa.q, qb.q)
    a, b = bf.nvfp4_dequantize(qa), bf.nvfp4_dequantize(qb)
    assert np.all(np.abs(a - b) <= 2 * np.spacing(np.abs(a)))
    assert np.array_equal(quant.roundtrip(x, "nvfp4"), a)
    assert np.linalg.norm(quant.roundtrip(x, "nvfp4_4over6") - x) < np.linalg.norm(a - x)
    with pytest.raises(ValueError, match="'recipe'"):
        bf.nvfp4_roundtrip(x, recipe="modelopt")
    with pytest.raises(ValueError, match="multiple of 16"):
        bf.nvfp4_roundtrip(np.ones((2, 24)))
    with pytest.raises(ValueError, match="'tensor_amax'"):
        bf.nvfp4_roundtrip(x, tensor_amax=0.0)


def test_block_formats_reject_bad_rows() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        quant.roundtrip(np.ones((2, 48)), "mxfp4")
    with pytest.raises(ValueError, match="finite"):
        quant.roundtrip(np.full((1, 32), np.inf), "mxfp8")
    with pytest.raises(ValueError, match="'element'"):
        bf.mx_roundtrip(np.ones((1, 32)), "float6_e2m3fn")
    with pytest.raises(ValueError, match="'block'"):
        bf.mx_roundtrip(np.ones((1, 32)), block=0)


def test_formats_describe_full() -> None:
    d = formats.describe_full("nvfp4")
    assert d["bits_per_value"] == 4.5 and d["element"] == "float4_e2m1fn" and d["engines"]["vllm"] == "nvfp4"
    assert d["bytes_per_value"] == str(Fraction(9, 16))
    assert isinstance(parse_spec("nvfp4"), CacheSpec)


# ------------------------------------------------------------------ llama.cpp's rotation as shipped

def test_llamacpp_rotation_as_shipped() -> None:
    # llama-kv-cache.cpp (ggml-org/llama.cpp@0c1e57098): quantized types and head sizes % 64 only; K in blocks of
    # the largest power of two dividing the head size, V in blocks of 64; LLAMA_ATTN_ROT_DISABLE=1 turns both off
    assert llamacpp_rotation("q4_0") == (128, 64)
    assert llamacpp_rotation("q8_0", "q4_0", 64) == (64, 64)                 # SmolLM2: kvcost's +hadamard is this
    assert llamacpp_rotation("q8_0", "f16", 128) == (128, None)              # f16 V is never rotated
    assert llamacpp_rotation("f16") == llamacpp_rotation("bf16") == (None, None)
    assert llamacpp_rotation("q4_0", head_dim_k=96) == (None, None)          # 96 % 64 != 0
    assert llamacpp_rotation("iq4_nl", head_dim_k=256) == (256, 64)
    assert llamacpp_rotation("q5_1", head_dim_k=576, head_dim_v=512) == (64, 64)
    assert llamacpp_rotation("q4_0", disabled=True) == (None, None)
    assert llamacpp_rotation("nvfp4") == (None, None)                         # not a llama.cpp cache type
    with pytest.raises(ValueError, match="'type_k'"):
        llamacpp_rotation("q3_k")
    with pytest.raises(ValueError, match="'head_dim_v'"):
        llamacpp_rotation("q4_0", head_dim_v=0)


# ------------------------------------------------------------------ vLLM's TurboQuant presets

@pytest.mark.parametrize("name, hd, key, value, slot", [
    # vLLM TurboQuantConfig (config.py): key = hd (fp8) or ceil(hd * b / 8) + 2 (fp16 norm); value =
    # ceil(hd * b / 8) + 4 (fp16 scale, zero); slot rounded up to even
    ("turboquant_k8v4", 128, 128, 68, 196), ("turboquant_4bit_nc", 128, 66, 68, 134),
    ("turboquant_k3v4_nc", 128, 50, 68, 118), ("turboquant_3bit_nc", 128, 50, 52, 102),
    ("turboquant_k8v4", 256, 256, 132, 388), ("turboquant_4bit_nc", 256, 130, 132, 262),
    ("turboquant_3bit_nc", 96, 38, 40, 78), ("turboquant_k3v4_nc", 64, 26, 36, 62),
])
def test_turboquant_slot_bytes(name: str, hd: int, key: int, value: int, slot: int) -> None:
    s = formats.turboquant_slot(name, hd)
    assert (s.key, s.value, s.slot_aligned) == (key, value, slot)
    assert formats.bytes_per_value(name, hd) == Fraction(slot, 2 * hd)
    # PR #38479's table (hd 128: 196 / 136 / 120 / 104) reserved a second fp16 norm for the MSE-key presets
    if hd == 128:
        assert s.slot + (2 if s.key_bits != 8 else 0) == {"turboquant_k8v4": 196, "turboquant_4bit_nc": 136,
                                                          "turboquant_k3v4_nc": 120, "turboquant_3bit_nc": 104}[name]


def test_turboquant_registry_and_vllm_pages() -> None:
    assert [formats.bits_per_value(n) for n in formats.TURBOQUANT] == [6.125, 4.1875, 3.6875, 3.1875]
    assert formats.from_engine("turboquant_3bit_nc", "vllm").family == "turboquant"
    assert formats.engine_name("turboquant_k8v4", "vllm") == "turboquant_k8v4"
    assert formats.from_engine("fp8_inc", "vllm").name == "fp8_e4m3"        # torch.float8_e4m3fn, one byte
    assert formats.get("turboquant_4bit_nc").channel_blocks                  # K's Hadamard mixes channels in order
    g = footprint.load_model("Llama-3.1-8B")                                   # 8 KV heads x 128
    # TQFullAttentionSpec.real_page_size_bytes = block_size x num_kv_heads x tq_slot_size
    for name, slot in [("turboquant_k8v4", 196), ("turboquant_4bit_nc", 134), ("turboquant_3bit_nc", 102)]:
        assert vllm.page_bytes(g, 16, 1, name) == 16 * 8 * slot
    assert footprint.cache_bytes(g, 1000, "turboquant_4bit_nc") == 32 * 8 * 134 * 1000
    with pytest.raises(ValueError, match="'name' must be a TurboQuant preset"):
        formats.turboquant_slot("turboquant_2bit")


def test_turboquant_codebook_is_max_1960() -> None:
    # vLLM's Lloyd-Max solution for N(0, 1/d), scaled by sqrt(d), against J. Max, "Quantizing for minimum
    # distortion" (IRE Trans. Inf. Theory IT-6, 1960), the Gaussian tables for 8 and 16 levels; vLLM's
    # trapezoid rule over +-10.5 sigma moves the outer levels by < 2e-3
    c3, m3 = tq.lloyd_max(128, 3)
    c4, _ = tq.lloyd_max(128, 4)
    assert c3.dtype == np.float32 and np.array_equal(c3, -c3[::-1]) and np.array_equal(m3, (c3[:-1] + c3[1:]) / 2)
    np.testing.assert_allclose(c3[4:] * np.sqrt(128), [0.2451, 0.7560, 1.3439, 2.1520], atol=2e-3)
    np.testing.assert_allclose(c4[8:] * np.sqrt(128), [0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0691,
                                                       2.7326], atol=2e-3)


def test_turboquant_keys() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4000, 128))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    # unit vectors: mean squared error near TurboQuant's D_mse (arXiv 2504.19874: ~0.03 at 3 bits, ~0.009 at 4)
    assert 0.031 < np.mean(np.sum((tq.key_roundtrip(x, 3, norm_correction=False) - x) ** 2, axis=1)) < 0.036
    assert 0.0085 < np.mean(np.sum((tq.key_roundtrip(x, 4, norm_correction=False) - x) ** 2, axis=1)) < 0.0100
    # a key that is a codebook vector in the rotated basis comes back exactly (codes, norm and rotation)
    h = tq.hadamard(8)
    assert np.array_equal(h, h.T) and np.allclose(h @ h, np.eye(8), atol=1e-6)
    c, mid = tq.lloyd_max(8, 3)
    codes = np.array([3, 4, 2, 5, 3, 4, 1, 6])
    unit = c[codes] / np.linalg.norm(c[codes])                     # |c[codes]| = 0.79: the codes stay the nearest
    assert np.array_equal(np.searchsorted(mid, unit.astype(np.float32), side="right"), codes)
    k = (np.float32(2.0) * unit.astype(np.float32)) @ h            # norm 2, exactly an fp16
    back = tq.key_roundtrip(k, 3, norm_correction=True)
    np.testing.assert_allclose(back, k, rtol=0, atol=2e-6)
    np.testing.assert_allclose(tq.key_roundtrip(k, 3, norm_correction=False), 2 * c[codes] @ h, atol=2e-6)
    # the norm is kept in fp16: 1 + 2^-12 reads back as 1
    one = np.zeros(8, dtype=np.float32)
    one[0] = 1 + 2.0 ** -12
    assert np.linalg.norm(tq.key_roundtrip(one, 4)) == pytest.approx(1.0, abs=1e-6)
    # k8v4: fp8 e4m3 at scale 1, nearest even, saturating at 448
    k8 = tq.key_roundtrip(np.array([1.0625, 1.1875, 500.0, -1e4, 0.0], dtype=np.float32), 8)
    assert list(k8) == [1.0, 1.25, 448.0, -448.0, 0.0]
    with pytest.raises(ValueError, match="power-of-two last axis"):
        tq.key_roundtrip(np.ones((2, 96)), 4)


def test_turboquant_values() -> None:
    # scale (max - min) / 15 = 0.25 and min -1 are fp16-exact: the grid comes back exactly
    v = (-1.0 + 0.25 * np.arange(16)).astype(np.float32)
    assert np.array_equal(tq.value_roundtrip(v, 4), v)
    # codes round half up: a value midway between two levels goes to the upper one
    w = v.copy()
    w[1] = -0.875                                                  # code 0.5 -> 1 (half to even would give 0)
    w[5] = 0.375                                                   # code 5.5 -> 6
    back = tq.value_roundtrip(w, 4)
    assert back[1] == -0.75 and back[5] == 0.5
    # 3 bits: 8 levels; scale and min read back as fp16 (0.1 / 7 and 0.3 are not fp16-exact)
    u = np.linspace(0.3, 0.4, 8, dtype=np.float32)
    s16, z16 = np.float32(np.float16(np.float32(0.1) / 7)), np.float32(np.float16(0.3))
    q = np.floor((u - u.min()) / (np.float32(0.4) - np.float32(0.3)) * 7 + 0.5)
    np.testing.assert_array_equal(tq.value_roundtrip(u, 3), (q * s16 + z16).astype(np.float32))
    # a constant vector: scale 1e-8 (0 in fp16) reads back as the fp16 minimum
    assert np.array_equal(tq.value_roundtrip(np.full(4, 0.1, np.float32), 3), np.full(4, np.float16(0.1), np.float32))
    # through the registry: role picks K's or V's half; store_kv takes both
    x = _x((2, 16, 128), spread=0.5)
    assert np.array_equal(quant.roundtrip(x, "turboquant_k3v4_nc", role="v"), tq.value_roundtrip(x, 4))
    assert np.array_equal(quant.roundtrip(x, "turboquant_k3v4_nc", role="k"), tq.key_roundtrip(x, 3))
    k, vv = quant.store_kv(x, x, "turboquant_3bit_nc")
    assert np.array_equal(k, tq.key_roundtrip(x, 3)) and np.array_equal(vv, tq.value_roundtrip(x, 3))
    with pytest.raises(ValueError, match="'bits'"):
        tq.value_roundtrip(x, 2)


# ------------------------------------------------------------------ torchao's reference, bit for bit

def _tie_rows() -> np.ndarray:
    """Blocks whose scaled values sit on E2M1 / E4M3 midpoints, saturate, or span 2^-60 .. 2^60."""
    x = _x((24, 256), spread=4.0)
    x[0, :8] = [5.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, -4.0]
    x[1, :32] = np.linspace(-7.9, 7.9, 32)
    x[2, :32] = 0.0
    x[3] *= np.float32(2.0 ** 60)
    x[4] *= np.float32(2.0 ** -60)
    return x


@pytest.mark.parametrize("element, block", [("float4_e2m1fn", 32), ("float4_e2m1fn", 16), ("float8_e4m3fn", 32)])
def test_mx_matches_torchao_bit_for_bit(element: str, block: int) -> None:
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    tdt = torch.float4_e2m1fn_x2 if element == "float4_e2m1fn" else torch.float8_e4m3fn
    x = _tie_rows()
    s, d = mx.to_mx(torch.from_numpy(x), tdt, block)          # ScaleCalculationMode.FLOOR: OCP's rule
    ref = mx.to_dtype(d, s, tdt, block, torch.float32).numpy()
    ours = bf.mx_quantize(x, element, block)
    assert np.array_equal(s.view(torch.uint8).numpy(), ours.scale)
    assert np.array_equal(ref, bf.mx_dequantize(ours))


def test_mxfp8_sglang_recipe_is_torchaos_rceil_bit_for_bit() -> None:
    """torchao's ScaleCalculationMode.RCEIL (``_to_mx_rceil``: ceil(log2(amax / 448)) clamped to +-127, x times
    2^-e clamped to +-448, cast to e4m3) is SGLang's mxfp8 rule on every block whose maximum is at least 1e-30;
    below it SGLang floors the maximum at 1e-30 (byte 19) where torchao takes the block's own exponent (byte 0 for
    an all-zero block). CEIL (ceil(log2 amax) - 8) is another rule."""
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    cfg = pytest.importorskip("torchao.prototype.mx_formats.config")
    hard = np.zeros((16, 32), dtype=np.float32)
    hard[:9] = _sglang_mxfp8_hard_blocks()
    x = np.concatenate([_tie_rows(), hard.reshape(2, 256)])
    s, d = mx.to_mx(torch.from_numpy(x), torch.float8_e4m3fn, 32, scaling_mode=cfg.ScaleCalculationMode.RCEIL)
    ref = mx.to_dtype(d, s, torch.float8_e4m3fn, 32, torch.float32).numpy()
    ours = bf.mx_quantize(x, "float8_e4m3fn", 32, recipe="sglang")
    tiny = np.abs(x.reshape(*ours.scale.shape, 32)).max(axis=-1) < 1e-30
    ts = s.view(torch.uint8).numpy().reshape(ours.scale.shape)
    zero = np.abs(x.reshape(*ours.scale.shape, 32)).max(axis=-1) == 0
    # all-zero blocks: torchao's ceil(log2(0)) clamps to byte 0; the 1e-35 block: torchao's own exponent,
    # ceil(log2(1e-35 / 448)) = -125 (byte 2); the float32-subnormal block clamps to byte 0 too. SGLang's floor gives
    # all of them 2^-108
    assert tiny.sum() == 11 and (ts[zero] == 0).all() and ts[tiny & ~zero].tolist() == [2, 0]
    assert (ours.scale[tiny] == 19).all()
    assert np.array_equal(ts[~tiny], ours.scale[~tiny])
    got = bf.mx_dequantize(ours)
    keep = np.repeat(~tiny, 32, axis=-1).reshape(x.shape)
    assert np.array_equal(ref[keep], got[keep]) and np.array_equal(np.signbit(ref), np.signbit(got))
    assert not got[~keep].any() or np.abs(got[~keep]).max() < 1e-30
    sc, _ = mx.to_mx(torch.from_numpy(x), torch.float8_e4m3fn, 32, scaling_mode=cfg.ScaleCalculationMode.CEIL)
    assert not np.array_equal(sc.view(torch.uint8).numpy().reshape(ours.scale.shape)[~tiny], ours.scale[~tiny])


def test_nvfp4_matches_torchao_bit_for_bit() -> None:
    torch = pytest.importorskip("torch")
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    x = _tie_rows()[:, :]
    x[3] /= np.float32(2.0 ** 60)                # NVFP4's e4m3 block scales span 2^-9 .. 448 only
    x[4] /= np.float32(2.0 ** -60)
    t = torch.from_numpy(x)
    n = nv.NVFP4Tensor.to_nvfp4(t, per_tensor_scale=nv.per_tensor_amax_to_scale(t.abs().max()))
    ours = bf.nvfp4_quantize(x)
    assert np.array_equal(n.scale.view(torch.float8_e4m3fn).float().numpy().reshape(ours.scale.shape), ours.scale)
    assert np.array_equal(n.dequantize(torch.float32).numpy(), bf.nvfp4_dequantize(ours))


def test_nvfp4_round_trip_in_pieces_is_the_one_piece_round_trip_bit_for_bit_in_bounded_memory():
    """NVFP4 is stored a piece of rows at a time with the whole array's amax as tensor scale: the values are one
    round trip's over the whole array (the amax sits in a late piece, so a piece's own amax would differ), for
    both recipes and 4-over-6, and the round trip's memory follows the piece, not the array."""
    import tracemalloc

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 700, 64)).astype(np.float32)
    x[2, 650, 7] = 900.0                                        # the tensor's amax, in the last piece
    for kw in ({}, {"recipe": "compressed-tensors"}, {"four_over_six": True}, {"tensor_amax": 2000.0}):
        want = bf.nvfp4_roundtrip(x, rows_per_piece=10**9, **kw)      # one piece
        assert np.array_equal(bf.nvfp4_roundtrip(x, **kw), want), kw  # the default piece holds all 2,100
        for rows in (1, 7, 512):
            assert np.array_equal(bf.nvfp4_roundtrip(x, rows_per_piece=rows, **kw), want), (kw, rows)
    one = bf.nvfp4_roundtrip(x, rows_per_piece=10**9)
    assert np.array_equal(quant.roundtrip(x, "nvfp4"), one)                   # the registry's path
    assert not np.array_equal(bf.nvfp4_roundtrip(x[0, :7]), one[0, :7])   # own amax: another store
    assert np.array_equal(bf.nvfp4_roundtrip(np.zeros((5, 16)), rows_per_piece=2), np.zeros((5, 16)))
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="rows_per_piece"):
            bf.nvfp4_roundtrip(x, rows_per_piece=bad)
    with pytest.raises(ValueError, match="finite"):
        bf.nvfp4_roundtrip(np.full((5, 16), np.inf), rows_per_piece=2)

    big = rng.standard_normal((1 << 15, 64)).astype(np.float32)          # 8 MiB of float32
    peaks = {}
    for rows in (1 << 15, 1 << 11):
        tracemalloc.start()
        bf.nvfp4_roundtrip(big, rows_per_piece=rows)
        peaks[rows] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peaks[1 << 15] > 4 * big.nbytes                      # one piece: temporaries of the whole
    assert peaks[1 << 11] < 3 * big.nbytes                      # in pieces: the result and one piece's


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2", "bf16", "fp16"])
def test_the_fast_cast_is_the_correct_rounding_bit_for_bit(name) -> None:
    """quant's float32 path casts (numpy / ml_dtypes, after clipping to the largest finite value); it must be
    kvcost.floats.round_to's single correct rounding with saturation on every float32 exponent and sign, at the
    exact ties (low bits zero), just above and just below them, and on inf and NaN."""
    from kvcost import floats

    high = np.arange(1 << 16, dtype=np.uint32) << 16                       # every sign, exponent, top 7 bits
    bits = np.concatenate([high, high | 1, high | 0xFFFF, high | 0x8000])
    x = bits.view(np.float32)
    with np.errstate(invalid="ignore"):                                     # signalling NaNs among the patterns
        fast = quant.fp8_roundtrip(x, name[4:], scale=1.0) if name.startswith("fp8") else quant.roundtrip(x, name)
        want = floats.round_to(x.astype(np.float64), name, saturate=True).astype(np.float32)
    assert fast.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(x))
    ok = ~np.isnan(x)
    np.testing.assert_array_equal(fast[ok].view(np.uint32), want[ok].view(np.uint32))   # -0.0 kept too
    top = floats.parse_format(name).max
    assert (np.abs(fast[np.isinf(x)]) == top).all()                        # saturating, as SATFINITE does


def test_fp8_storage_is_the_quotient_rounded_once() -> None:
    # scaled: fp8(x / s) * s, the quotient taken in float32; a tie at 1 + 2^-4 goes to even (1.0), just above up
    x = np.array([1.0625, 1.0625 + 2 ** -20, 500.0, -1e9, np.nan], dtype=np.float32) * 2
    q = quant.fp8_roundtrip(x, "e4m3", scale=2.0)
    np.testing.assert_array_equal(q[:4], np.array([1.0, 1.125, 448.0, -448.0], dtype=np.float32) * 2)
    assert np.isnan(q[4])


def test_make_bench_times_fp8_storage_against_its_definition() -> None:
    from kvcost import bench

    assert bench.bench_fp8_storage in bench.BENCHMARKS
    (row,) = bench.bench_fp8_storage(tokens=512, head_dim=64)
    assert row.note.endswith("results identical") and row.bar == 3.0 and row.value > 0
