"""The jobs that produce committed data (``python -m kvcost.runs.<name>``; ``scripts/<name>.py`` are thin
entry points to them): each parses its flags, runs, and writes its table with provenance beside it
(:func:`kvcost.provenance.write_run`).
"""
