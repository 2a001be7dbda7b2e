"""The post's claims, checked: comparisons with its printed output, errata and verdict text.

One module per notebook; claims use experiments and primitives, never the interfaces.
"""
