"""What the experiments feed attention: the post's random stream and its synthetic caches
(:mod:`.synthetic`), the post's printed tables (:mod:`.post`), and keys and values captured from real
models with their outlier statistics (:mod:`.extracts`).
"""
