"""What each notebook computes: its tables, one module per notebook or topic.

Experiments use the primitives (top-level modules of kvcost) and nothing above them.
"""
