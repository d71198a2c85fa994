"""Bloom (BigScience): converted onto the GPT-family decoder."""
