"""The package's logger: one line per message on stderr, level from TLLM_LOG_LEVEL."""
import logging
import os
import sys

logger = logging.getLogger("tensorrt_llm")
if not logger.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("[tensorrt_llm] %(levelname)s %(message)s"))
    logger.addHandler(_handler)
    logger.propagate = False
logger.setLevel(os.environ.get("TLLM_LOG_LEVEL", "WARNING").upper())
