"""The jobs that produce committed data (``python -m kvcost.runs.<name>``; ``scripts/<name>.py`` are thin
entry points to them, under the names the committed provenance records): each parses its flags
(``parse_args(argv)``, which a sweep calls to check every run's flags before anything runs), runs, and
writes its table with provenance beside it (:func:`kvcost.provenance.write_run`).

- real decoders on the CPU: ``real_model_ppl``, ``real_model_passkey``, ``real_model_extract``,
  ``llamacpp_reference`` (llama.cpp's own answer), and their text, ``real_model_text``;
- ``extract_real_kv``: all-MiniLM-L6-v2's K/V (its provenance is the extract's own ``meta``; its R reader,
  :func:`~kvcost.runs.extract_real_kv.read_novel`, is shared with ``real_model_text``);
- long-context measurements: ``long_range_needle``, ``long_range_retrieval`` (notebook 06), ``plan_needle``
  (09), ``which_gpu_grid`` (10); ``tensorcore_validation``, the units against MMA-Sim;
- the documentation's generated tables: ``gen_docs`` (docs/notebooks.md), ``plan_readme_table`` (README.md).

What the jobs share in writing their tables is ``tables`` (the resumable chunked-append loop and the
``--check`` of a generated document); the one job another imports is ``extract_real_kv`` (its R reader).
"""
