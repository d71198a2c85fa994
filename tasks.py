"""Development tasks (`invoke --list`). User-facing recipes live in the Makefile and build_wheel.py;
the tasks here call them, and hold only what is development-only (lint, format, test subsets,
the GPU-machine check)."""
from invoke import task

PY = "python3"


@task(help={"archs": 'CUDA architectures (default "80-real;90-real"; "native" on a GPU machine)',
            "jobs": "compile jobs (default: build_wheel.py decides)"})
def build(c, archs="80-real;90-real", jobs=""):
    """Build the module and the wheel (make wheel)."""
    c.run(f'make wheel CUDA_ARCHS="{archs}"' + (f" JOBS={jobs}" if jobs else ""), pty=False)


@task(help={"archs": "CUDA architectures"})
def develop(c, archs="80-real;90-real"):
    """Build the module into tensorrt_llm/ and install this checkout editable (make develop)."""
    c.run(f'make develop CUDA_ARCHS="{archs}"')


@task
def lint(c):
    """ruff over the Python files of the build and kernel layers."""
    c.run(f"{PY} -m ruff check build_wheel.py setup.py tasks.py tensorrt_llm/kernels tests/kernels "
          "tests/test_build_wheel.py tests/conftest.py")


@task(name="format")
def format_(c):
    """ruff format (Python) and clang-format (C++/CUDA, when installed) over the same files."""
    c.run(f"{PY} -m ruff format build_wheel.py setup.py tasks.py tensorrt_llm/kernels tests/kernels "
          "tests/test_build_wheel.py tests/conftest.py")
    c.run("command -v clang-format >/dev/null && clang-format -i cpp/*/*.cpp cpp/*/*.cu cpp/*/*.cuh cpp/*/*/*.h "
          "|| echo 'clang-format not installed: C++ left as is'")


@task(help={"subset": "kernels | build | all (default: kernels)", "args": "extra pytest arguments"})
def test(c, subset="kernels", args=""):
    """pytest on a subset, against the module already built (no rebuild)."""
    paths = {"kernels": "tests/kernels", "build": "tests/test_build_wheel.py", "all": "tests"}[subset]
    c.run(f"{PY} -m pytest {paths} -q {args}")


@task
def ci(c):
    """What CI runs (.ci/run -> make test)."""
    c.run("bash .ci/run")


@task
def gpu(c):
    """On the GPU machine: build with -a native, install editable, run the GPU tests (scripts/gpu_check.sh)."""
    c.run("bash scripts/gpu_check.sh")
