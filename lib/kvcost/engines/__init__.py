"""What the serving engines allocate, modelled from their source at named commits: llama.cpp
(:mod:`.llamacpp`), vLLM (:mod:`.vllm`), and the engines' own log lines checked against both
(:mod:`.logs`).
"""
