"""The fleet planner, one concept per module: the GPU catalogue (:mod:`.gpus`), requests one replica's
KV budget holds as each engine counts them (:mod:`.capacity`), the decode-speed estimate (:mod:`.decode`),
what a format's accuracy rests on (:mod:`.evidence`), and the plan that joins them (:mod:`.fleet`).
"""
