"""`trtllm-build-info`: what the installed tensorrt_llm holds (version, compiled kernels, GPU)."""
from __future__ import annotations

import json
import sys


def collect() -> dict:
    from tensorrt_llm.version import __version__
    info = {"tensorrt_llm": __version__}
    try:
        from tensorrt_llm import bindings
    except ImportError as e:
        info["bindings"] = f"not importable: {e}"
        return info
    info["bindings"] = bindings.build_info()
    try:
        import torch
        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except ImportError:
        info["torch"] = None
    return info


def main(argv=None) -> int:
    info = collect()
    print(json.dumps(info, indent=2))
    return 0 if isinstance(info.get("bindings"), dict) else 1


if __name__ == "__main__":
    sys.exit(main())
