"""Needle retrieval at long context, as a primitive the experiments share: haystacks built from real heads
(:mod:`.haystacks`) and the measure that says whether a kernel kept the needle (:mod:`.measure`).
"""
