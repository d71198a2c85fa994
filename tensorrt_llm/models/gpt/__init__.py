"""The GPT family: GPT-2, OPT, Phi and Bloom share one LayerNorm decoder (model.py)."""
