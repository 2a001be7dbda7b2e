"""kvcost: what KV-cache quantization costs at long range.

Four layers, each importing only from its own layer or below (``make lint`` checks it;
docs/architecture.md draws the house):

**Primitives**, one concept per module, in rooms named for what they hold:

- top level: ``paths`` (where the data and the repository are), ``floats`` (float formats, correct
  rounding), ``units``, ``stats`` (intervals and tests), ``provenance``, ``output``, ``params``
- ``inputs``: the post's random stream and caches (``synthetic``), its printed tables (``post``), real
  keys and values (``extracts``)
- ``storage``: the one registry of storage formats (``formats``), the spec parser (``spec``), the
  quantizers (``quant``, ``ggml``, ``blockfloat``, ``turboquant``)
- ``numerics``: accumulation (``accum``), every GPU's tensor-core units (``instructions``,
  ``tensorcore``, bit for bit MMA-Sim, ``oracle``), the post's attention arithmetic (``attention``), the
  FP8 attention kernels (``fa3``, ``fa3kernel``, ``kernels``)
- ``models``: configs (``hfconfig``), the model registry (``registry``), weights, KV bytes
  (``footprint``), the real decoders (``decoders``, ``sliding_window``)
- ``engines``: llama.cpp and vLLM allocation, their logs
- ``planning``: GPUs, capacity, decode speed, evidence, the fleet plan

**Experiments** (``kvcost.experiments.<notebook stem>``): what each notebook computes, its tables.

**Claims** (``kvcost.claims.<notebook stem>``): each notebook's checks against the post's printed
output and the published numbers, its errata and its verdict; ``claims.report`` renders them.

**Interfaces**: the notebooks, ``cli``, ``run``/``runner``, ``runs`` (the data-producing jobs that
``scripts/`` start), ``sweep``, ``bench``, ``plotting``, ``notebook_params``, ``nbclean``.

The documented API names (docs/api.md) stay reachable as ``kvcost.<name>``: ``from kvcost import sizing,
accum, quant, tensorcore, fa3`` and ``import kvcost.sizing`` give the modules that hold them
(:data:`ALIASES`), loaded on first use so that ``import kvcost`` stays light.
"""

__version__ = "0.1.0"

import importlib
import importlib.abc
import importlib.util
import sys

#: kvcost.<name> -> the module that holds it (one module, two spellings: the documented one and its room).
ALIASES = {
    "sizing": "kvcost.models.footprint",
    "quant": "kvcost.storage.quant",
    "formats": "kvcost.storage.formats",
    "accum": "kvcost.numerics.accum",
    "tensorcore": "kvcost.numerics.tensorcore",
    "fa3": "kvcost.numerics.fa3",
    "fa3kernel": "kvcost.numerics.fa3kernel",
    "instructions": "kvcost.numerics.instructions",
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import kvcost.sizing`` (and ``from kvcost.sizing import …``) load the module it names."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.partition(".")
        if prefix == __name__ and name in ALIASES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(ALIASES[spec.name.partition(".")[2]])

    def exec_module(self, module):
        pass                                  # the real module ran when it was imported under its own name


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.append(_AliasFinder())


def __getattr__(name: str):
    if name in ALIASES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
