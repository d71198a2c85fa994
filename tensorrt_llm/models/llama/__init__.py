"""The LLaMA family (LLaMA 1-3, SmolLM2, TinyLlama, ...)."""
