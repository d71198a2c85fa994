"""Phi-1/1.5/2 (Microsoft): converted onto the GPT-family decoder."""
