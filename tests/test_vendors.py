"""Vendor-table arithmetic: each checkable number recomputed from geometry and block sizes."""
import pytest

from kvcost.claims import vendor_table
from kvcost.experiments import vendor_table as vendor_data


def _by_claim(fragment):
    (check,) = [c for c in vendor_table.errata() if fragment in c.claim]
    return check


def test_measurements_have_a_citation_per_row():
    df = vendor_data.load_measurements()
    assert len(df) == 9
    assert (df.citation.str.len() > 0).all()


@pytest.mark.parametrize("fragment,computed,agrees", [
    ("cuts Qwen3-8B's 32K cache", "2.1", True),
    ("a 47% saving", "2.109", False),       # 4.5 GiB x 30/64 = 2.109375
    ("in fp16 (Nemotron", "768", True),     # 6 x 2 x 128 x 2 x 2 B x 131072 = 768 MiB
    ("in q8_0 (Nemotron", "408", True),     # 768 x 34/64
    ("in q4_0 (Nemotron", "216", True),     # 768 x 18/64
    ("worth 76 points", "76", True),
    ("decode throughput", "45", True),
    ("FP8: 2x", "2x", True),
    ("gpt-oss-20b keeps", "128", True),
])
def test_checks_compute_the_published_arithmetic(fragment, computed, agrees):
    check = _by_claim(fragment)
    assert check.computed == computed
    assert check.agrees is agrees


def test_kvquant_three_bit_million_tokens_do_not_fit_an_a100():
    check = _by_claim("KVQuant")
    # 32 layers x 32 heads x 128 x 2 x 3/8 B = 98,304 B/token; x 1e6 = 98.3 GB > 80 GB
    assert check.computed.endswith("98.3 GB") and not check.agrees


def test_weights_ratio_follows_the_parameter():
    assert _by_claim("more than 3x").agrees
    (small,) = [c for c in vendor_table.errata(weights_gib=6.0) if "more than 3x" in c.claim]
    assert not small.agrees    # 16 / 6 = 2.67x


def test_checks_table_has_the_contract_columns():
    assert list(vendor_table.checks_table().columns) == ["claim", "published", "computed", "agrees"]


def test_published_numbers_come_from_the_data_file():
    assert vendor_data.published("dgx_spark_kv_q8_0_mib") == 408
    assert vendor_data.published("q4_k_m_weights_gib") == 4.68
    with pytest.raises(ValueError, match="'key'"):
        vendor_data.published("nope")
