"""Storage formats: exact bytes per value, metadata included (hand-computed)."""
from fractions import Fraction

import pytest

from kvcost.storage import formats


@pytest.mark.parametrize("name, nbytes", [("fp32", 4), ("bf16", 2), ("fp16", 2), ("f16", 2), ("f32", 4),
                                          ("fp8_e4m3", 1), ("fp8_e5m2", 1), ("fp8", 1)])
def test_plain_formats(name: str, nbytes: int) -> None:
    assert formats.bytes_per_value(name) == nbytes
    assert formats.bits_per_value(name) == 8 * nbytes


@pytest.mark.parametrize("name, block_bytes", [("q8_0", 34), ("q4_0", 18), ("q4_1", 20), ("q5_0", 22),
                                               ("q5_1", 24), ("iq4_nl", 18)])
def test_llama_cpp_blocks_are_exact_bytes_per_32_values(name: str, block_bytes: int) -> None:
    assert formats.bytes_per_value(name) == Fraction(block_bytes, 32)
    assert formats.row_bytes(name, 32) == block_bytes
    assert formats.row_bytes(name, 1024) == 32 * block_bytes
    assert formats.row_bytes(name, 33) == 2 * block_bytes          # a partial block is a whole block


def test_bits_per_value_headline_numbers() -> None:
    assert formats.bits_per_value("q8_0") == 8.5
    assert formats.bits_per_value("q4_0") == 4.5
    assert formats.bits_per_value("q4_1") == 5.0
    assert formats.bits_per_value("q5_0") == 5.5
    assert formats.bits_per_value("q5_1") == 6.0
    assert formats.bits_per_value("iq4_nl") == 4.5


def test_kivi_groups_count_scale_and_zero_point() -> None:
    # int2 in groups of 32: 2 bits + (16 + 16) / 32 = 3 bits per value.
    assert formats.bits_per_value("int2_g32") == 3.0
    assert formats.bits_per_value("int4_g128") == 4.25                # 4 + 32/128
    assert formats.bits_per_value("kivi2") == 3.0
    assert formats.get("kivi2").residual == 128
    f = formats.get("kivi4_g64_r32")
    assert (f.payload_bits, f.block, f.residual) == (4, 64, 32)
    assert f.bytes_per_value() == Fraction(4, 8) + Fraction(4, 64)


def test_fp8_scales_per_token_and_per_head() -> None:
    # one fp32 scale per 128-value head vector: 1 + 4/128 bytes
    assert formats.bytes_per_value("fp8_e4m3_token", head_dim=128) == Fraction(33, 32)
    assert formats.bits_per_value("fp8_e5m2_token", head_dim=64) == 8.5
    assert formats.row_bytes("fp8_e4m3_token", 1024, head_dim=128) == 1024 + 8 * 4
    # static per-head scales: 1 byte per value, 4 bytes per KV head per layer, once
    assert formats.bytes_per_value("fp8_e4m3_head") == 1
    assert formats.fixed_bytes("fp8_e4m3_head", 8) == 32
    assert formats.fixed_bytes("fp8_e4m3", 8) == 0


def test_get_has_name_description_and_is_case_insensitive() -> None:
    f = formats.get("Q8_0")
    assert f.name == "q8_0" and "34 bytes per 32 values" in f.description
    assert formats.describe("q4_0")["bits_per_value"] == 4.5


@pytest.mark.parametrize("bad", ["q9_0", "int9_g32", "int4_g0", "fp8_e3m4", "", "kivi0"])
def test_unknown_formats_raise(bad: str) -> None:
    with pytest.raises(ValueError):
        formats.get(bad)


def test_non_string_format_raises() -> None:
    with pytest.raises(ValueError, match="format"):
        formats.get(8)  # type: ignore[arg-type]


def test_post_int_k_formats_count_their_scales() -> None:
    # per token: k bits + one fp32 scale per head vector; per channel: the scales are a constant
    assert formats.bytes_per_value("int4_token", 128) == Fraction(1, 2) + Fraction(4, 128)
    assert formats.bits_per_value("int8_token", 64) == 8.5
    assert formats.bytes_per_value("int4_channel") == Fraction(1, 2)
    with pytest.raises(ValueError, match="bits must be between 2 and 16"):
        formats.get("int1_token")
