"""tensorrt_llm: convert, build and run LLMs on our own engine backend."""
