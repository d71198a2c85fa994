"""OPT (Meta): converted onto the GPT-family decoder."""
