"""Test configuration: property-based tests run the same examples on every machine.

Hypothesis draws from a fixed seed (derandomize), so a CI run is reproducible and a
failure seen once is seen again; its example database stays out of the repository.

The exact references several test files hold kvcost to (textbook rounding of a rational, the tensor-core
instruction and its chain, the e4m3 cast by ml_dtypes, the post's Block 2 quantizer) live once, as plain
functions, in tests/references.py (``from references import ...``), each written independently of the
kvcost code it checks.
"""
import matplotlib
from hypothesis import settings

matplotlib.use("Agg")
settings.register_profile("kvcost", derandomize=True, database=None, print_blob=True)
settings.load_profile("kvcost")
