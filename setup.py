"""Packaging of tensorrt_llm: a platform wheel holding the compiled module tensorrt_llm.bindings.

Use `python build_wheel.py` (it runs CMake, then pip wheel on this file). A plain
`pip install .` or `pip install -e .` also works: build_py runs build_wheel.py first to build
the module incrementally. A wheel is never made without the compiled module.
"""
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
MODULE = f"bindings{sysconfig.get_config_var('EXT_SUFFIX')}"

# Console scripts, each included when its module exists in this checkout.
CONSOLE_SCRIPTS = {
    # cli(): main() through tensorrt_llm.cli.run_cli (one "error:" line, --debug).
    "trtllm-build": "tensorrt_llm.commands.build:cli",
    "trtllm-refit": "tensorrt_llm.commands.refit:cli",
    "trtllm-serve": "tensorrt_llm.commands.serve:cli",
    "trtllm-bench": "tensorrt_llm.commands.bench:main",
    "trtllm-build-info": "tensorrt_llm.kernels.info:main",
}


def read_version() -> str:
    text = (ROOT / "tensorrt_llm" / "version.py").read_text()
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    if not match:
        raise RuntimeError("no __version__ in tensorrt_llm/version.py")
    return match.group(1)


def read_requirements(name: str = "requirements.txt") -> list:
    reqs = []
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            reqs.append(line)
    return reqs


def console_scripts() -> list:
    scripts = []
    for name, target in CONSOLE_SCRIPTS.items():
        module = target.split(":")[0]
        if (ROOT / (module.replace(".", "/") + ".py")).is_file():
            scripts.append(f"{name}={target}")
    return scripts


class BuildPy(build_py):
    """Makes sure tensorrt_llm/bindings*.so is built before the package files are collected."""

    def run(self):
        module = ROOT / "tensorrt_llm" / MODULE
        if not os.environ.get("TRTLLM_BINDINGS_BUILT"):
            # Not driven by build_wheel.py: let it build (incrementally) the module for this Python.
            cmd = [sys.executable, str(ROOT / "build_wheel.py"), "--skip_building_wheel"]
            print("setup.py: building tensorrt_llm.bindings: " + " ".join(cmd), flush=True)
            subprocess.check_call(cmd, cwd=ROOT)
        if not module.is_file():
            raise SystemExit(f"setup.py: {module} is missing; run `python build_wheel.py` first")
        super().run()


class BinaryDistribution(Distribution):
    """The wheel holds a compiled module: tag it for this platform and Python."""

    def has_ext_modules(self):
        return True


setup(
    name="tensorrt_llm",
    version=read_version(),
    description="Convert, build and run LLMs: graph compiler, runtime and CUDA kernels on PyTorch",
    long_description=(ROOT / "README.md").read_text() if (ROOT / "README.md").is_file() else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["tensorrt_llm", "tensorrt_llm.*"]),
    package_data={"tensorrt_llm": [MODULE]},
    install_requires=read_requirements(),
    entry_points={"console_scripts": console_scripts()},
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPy},
    options={"build": {"build_base": "build/setuptools"}},
    zip_safe=False,
)
