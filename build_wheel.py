#!/usr/bin/env python3
"""Build tensorrt_llm: the C++/CUDA module tensorrt_llm.bindings (CMake), then the wheel.

    python build_wheel.py                          # CUDA kernels for 80-real;90-real, wheel in dist/
    python build_wheel.py -a native -s -i          # GPU machine: this GPU only, editable install
    python build_wheel.py --cpu_only               # no CUDA kernels

Stages: requirements (pybind11, setuptools, CMake >= 3.24 and Ninja; with
--install_build_requirements the missing or too old ones are pip-installed into this Python),
configure (CMake, reusing --build_dir), build (the compiler, -j jobs), copy the module
into tensorrt_llm/, wheel (pip wheel --no-build-isolation --no-deps: nothing is downloaded),
install (-i). Each stage prints its time; a failing stage ends the script with the compiler's
(or CMake's, or pip's) own output and its exit code, never a Python traceback.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = ROOT / "tensorrt_llm"
DEFAULT_ARCHS = "80-real;90-real"
GIB = 1 << 30
MEMORY_PER_JOB = 4 * GIB  # nvcc on two architectures peaks well under this; the host compiler too
MANIFEST_NAME = "build_wheel.json"
SETUPTOOLS_BUILD_DIR = ROOT / "build" / "setuptools"  # setup.py's build_base


class StageFailed(Exception):
    def __init__(self, stage: str, code: int, message: str = ""):
        super().__init__(message)
        self.stage, self.code, self.message = stage, code, message


def log(msg: str) -> None:
    print(f"[build_wheel] {msg}", flush=True)


# ---- facts about the machine -------------------------------------------------------------------

def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_memory() -> Optional[int]:
    """MemAvailable in bytes (Linux), None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_job_count(cores: Optional[int] = None, memory: Optional[int] = None) -> int:
    """min(cores, available memory / 4 GiB), at least 1: never all cores blindly."""
    cores = cpu_count() if cores is None else cores
    memory = available_memory() if memory is None else memory
    jobs = cores
    if memory is not None:
        jobs = min(jobs, memory // MEMORY_PER_JOB)
    return max(1, int(jobs))


def find_nvcc(env: Optional[dict] = None, fallbacks: Sequence[str] = ("/usr/local/cuda/bin/nvcc",)) -> Optional[str]:
    """$CUDACXX, nvcc on PATH, $CUDA_HOME/bin/nvcc, then the fallbacks (first that exists)."""
    env = os.environ if env is None else env
    candidates = [env.get("CUDACXX"), shutil.which("nvcc", path=env.get("PATH"))]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            candidates.append(os.path.join(env[var], "bin", "nvcc"))
    candidates += list(fallbacks)
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def module_filename() -> str:
    return "bindings" + sysconfig.get_config_var("EXT_SUFFIX")


def read_cmake_cache(build_dir: Path) -> dict:
    cache = build_dir / "CMakeCache.txt"
    values = {}
    if cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            if not line or line.startswith(("#", "//")) or "=" not in line or ":" not in line.split("=", 1)[0]:
                continue
            key_type, value = line.split("=", 1)
            values[key_type.split(":", 1)[0]] = value
    return values


# ---- build requirements ------------------------------------------------------------------------

# What the build needs in the Python running it; pyproject.toml lists the same for isolated builds.
BUILD_REQUIREMENTS = {"pybind11": (2, 12), "setuptools": (70, 1), "cmake": (3, 24), "ninja": None}


def version_tuple(text: str) -> tuple[int, ...]:
    """(3, 24, 0) from "3.24.0-rc1": the leading digits of each dotted part, up to the first without."""
    parts = []
    for piece in text.split("."):
        digits = piece[:len(piece) - len(piece.lstrip("0123456789"))]
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def scripts_dir() -> Path:
    """Where pip puts this Python's commands (a venv's bin/): found even when not on PATH."""
    return Path(sysconfig.get_path("scripts"))


def find_tool(name: str) -> Optional[str]:
    """`name` on PATH, else in this Python's scripts folder (where `pip install cmake ninja` puts them)."""
    found = shutil.which(name)
    local = scripts_dir() / name
    if name == "cmake" and found and local.is_file() and not tool_version_ok(found, BUILD_REQUIREMENTS["cmake"]):
        return str(local)  # an old system cmake first on PATH; the pip one is new enough
    return found or (str(local) if local.is_file() and os.access(local, os.X_OK) else None)


def tool_version_ok(path: str, minimum: Optional[tuple[int, ...]]) -> bool:
    if minimum is None:
        return True
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    words = out.split()
    # "cmake version 3.25.1"
    version = words[2] if len(words) > 2 and words[1] == "version" else (words[0] if words else "")
    return version_tuple(version) >= minimum


def module_version(name: str) -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def missing_build_requirements(need_setuptools: bool = True) -> list[str]:
    """pip specs of what this Python lacks to build: modules missing or too old, tools not found."""
    missing = []
    for name, minimum in BUILD_REQUIREMENTS.items():
        spec = name + (">=" + ".".join(map(str, minimum)) if minimum else "")
        if name in ("cmake", "ninja"):
            tool = find_tool(name)
            if tool is None or not tool_version_ok(tool, minimum):
                missing.append(spec)
        elif name != "setuptools" or need_setuptools:
            version = module_version(name)
            if version is None or (minimum and version_tuple(version) < minimum):
                missing.append(spec)
    return missing


def ensure_build_requirements(args: argparse.Namespace) -> None:
    need_setuptools = not args.skip_building_wheel or args.install
    missing = missing_build_requirements(need_setuptools)
    if not missing:
        log("build requirements present")
        return
    if not args.install_build_requirements:
        raise StageFailed("requirements", 1, f"this Python ({sys.executable}) lacks {', '.join(missing)}: "
                          f"{sys.executable} -m pip install {' '.join(shlex.quote(m) for m in missing)} "
                          "(or run build_wheel.py --install_build_requirements)")
    run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *missing], "requirements")
    still = missing_build_requirements(need_setuptools)
    if still:
        raise StageFailed("requirements", 1, f"still missing after pip install: {', '.join(still)}")


# ---- arguments -------------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-a", "--cuda_architectures", default=DEFAULT_ARCHS,
                   help='CMAKE_CUDA_ARCHITECTURES, e.g. "80-real;90-real" (default), "90", or "native" '
                        "(the GPUs of this machine)")
    p.add_argument("-b", "--build_type", default="Release", choices=["Release", "RelWithDebInfo", "Debug"],
                   help="CMake build type (default: Release)")
    p.add_argument("-j", "--job_count", type=int, default=None,
                   help="parallel compile jobs (default: the smaller of the core count and available "
                        f"memory / 4 GiB; here {default_job_count()})")
    p.add_argument("-c", "--clean", action="store_true", help="delete the build folder first (a full rebuild)")
    p.add_argument("--build_dir", type=Path, default=ROOT / "cpp" / "build",
                   help="CMake build folder, reused between runs (default: cpp/build)")
    p.add_argument("--dist_dir", type=Path, default=ROOT / "dist", help="where the wheel goes (default: dist)")
    p.add_argument("--cpu_only", action="store_true", help="build without the CUDA kernels")
    p.add_argument("-s", "--skip_building_wheel", action="store_true",
                   help="build the module and put it into tensorrt_llm/ only (with -i: an editable install)")
    p.add_argument("-i", "--install", action="store_true",
                   help="pip install the wheel (with -s: an editable install of this checkout); offline, no deps")
    p.add_argument("--use_ccache", action="store_true", help="compile through ccache")
    p.add_argument("--install_build_requirements", action="store_true",
                   help="pip install what the build lacks into this Python (pybind11, setuptools, and cmake "
                        "and ninja when not found or too old) instead of stopping with the command to run")
    p.add_argument("-D", "--extra-cmake-vars", dest="extra_cmake_vars", action="append", default=[],
                   metavar="NAME=VALUE", help="extra CMake cache entries, repeatable (-D A=1 -D B=2)")
    args = p.parse_args(argv)
    if args.job_count is not None and args.job_count < 1:
        p.error("--job_count must be >= 1")
    for var in args.extra_cmake_vars:
        if "=" not in var or var.startswith("="):
            p.error(f"-D expects NAME=VALUE, got {var!r}")
    args.build_dir = args.build_dir.resolve()
    args.dist_dir = args.dist_dir.resolve()
    return args


# ---- stages -------------------------------------------------------------------------------------

def run(cmd: Sequence[str], stage: str, cwd: Path = ROOT, env: Optional[dict] = None) -> None:
    """Runs cmd with its output going straight to the terminal; StageFailed on a non-zero exit."""
    print("+ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    try:
        code = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env).returncode
    except FileNotFoundError as e:
        raise StageFailed(stage, 127, f"{stage}: cannot run {cmd[0]}: {e}") from None
    if code != 0:
        raise StageFailed(stage, code, f"{stage} failed (exit {code}); the tool's own output is above")


class Stages:
    def __init__(self):
        self.times: dict[str, float] = {}

    def __call__(self, name: str):
        stages = self

        class _Stage:
            def __enter__(self):
                log(f"==> {name}")
                self.start = time.perf_counter()

            def __exit__(self, exc_type, exc, tb):
                elapsed = time.perf_counter() - self.start
                stages.times[name] = round(elapsed, 2)
                if exc_type is None:
                    log(f"<== {name}: {elapsed:.1f} s")
                return False

        return _Stage()


def pybind11_cmake_dir() -> str:
    try:
        import pybind11
    except ImportError:
        raise StageFailed("configure", 1, "pybind11 is not installed for this Python "
                          f"({sys.executable}): pip install pybind11") from None
    return pybind11.get_cmake_dir()


def configure_command(args: argparse.Namespace, nvcc: Optional[str], generator: str) -> list[str]:
    cmd = [find_tool("cmake") or "cmake", "-S", str(ROOT / "cpp"), "-B", str(args.build_dir), "-G", generator,
           f"-DCMAKE_BUILD_TYPE={args.build_type}",
           f"-DPython_EXECUTABLE={sys.executable}",
           f"-Dpybind11_DIR={pybind11_cmake_dir()}",
           f"-DTRTLLM_GIT_COMMIT={git_commit()}"]
    ninja = find_tool("ninja") if generator == "Ninja" else None
    if ninja and not shutil.which("ninja"):
        cmd += [f"-DCMAKE_MAKE_PROGRAM={ninja}"]  # pip's ninja, in this Python's scripts folder
    launcher = shutil.which("ccache") if args.use_ccache else ""
    cmd += [f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}"]
    if nvcc:
        cmd += ["-DTRTLLM_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}",
                f"-DCMAKE_CUDA_ARCHITECTURES={args.cuda_architectures}",
                f"-DCMAKE_CUDA_COMPILER_LAUNCHER={launcher}"]
    else:
        cmd += ["-DTRTLLM_CUDA=OFF"]
    cmd += [f"-D{v}" for v in args.extra_cmake_vars]
    return cmd


def prepare_build_dir(args: argparse.Namespace) -> str:
    """Cleans the build folder when asked or when it cannot be reused; returns the generator."""
    if args.clean and args.build_dir.exists():
        log(f"--clean: removing {args.build_dir}")
        shutil.rmtree(args.build_dir)
    cache = read_cmake_cache(args.build_dir)
    if cache:
        stale = None
        if Path(cache.get("CMAKE_HOME_DIRECTORY", "")).resolve() != (ROOT / "cpp").resolve():
            stale = f"it was configured for {cache.get('CMAKE_HOME_DIRECTORY')}"
        elif cache.get("Python_EXECUTABLE") and cache["Python_EXECUTABLE"] != sys.executable:
            stale = f"it was configured for Python {cache['Python_EXECUTABLE']}"
        if stale:
            log(f"notice: rebuilding {args.build_dir} from scratch: {stale}")
            shutil.rmtree(args.build_dir)
            cache = {}
    if cache.get("CMAKE_GENERATOR"):
        return cache["CMAKE_GENERATOR"]
    return "Ninja" if find_tool("ninja") else "Unix Makefiles"


def copy_module(args: argparse.Namespace) -> Path:
    built = args.build_dir / "tensorrt_llm" / module_filename()
    if not built.is_file():
        raise StageFailed("copy", 1, f"the build finished but {built} is missing")
    dest = PACKAGE_DIR / built.name
    if dest.exists() and filecmp.cmp(built, dest, shallow=False):
        log(f"{dest.relative_to(ROOT)} is up to date")
    else:
        tmp = dest.with_suffix(".tmp")
        shutil.copy2(built, tmp)
        os.replace(tmp, dest)  # atomic: a running process keeps its mapped copy
        log(f"copied {built.name} -> {dest.relative_to(ROOT)}")
    return dest


def setup_env() -> dict:
    """Environment for pip running setup.py: tells it the module is built (so it does not rebuild)."""
    return dict(os.environ, TRTLLM_BINDINGS_BUILT="1")


def build_wheel_file(args: argparse.Namespace) -> Path:
    # setuptools' scratch folder (setup.py's build_base): start empty so no stale file enters the wheel
    shutil.rmtree(SETUPTOOLS_BUILD_DIR, ignore_errors=True)
    args.dist_dir.mkdir(parents=True, exist_ok=True)
    before = {p: p.stat().st_mtime for p in args.dist_dir.glob("tensorrt_llm-*.whl")}
    run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "-w", str(args.dist_dir)], "wheel", env=setup_env())
    wheels = [p for p in args.dist_dir.glob("tensorrt_llm-*.whl") if before.get(p) != p.stat().st_mtime]
    if len(wheels) != 1:
        raise StageFailed("wheel", 1, f"expected one new wheel in {args.dist_dir}, found {wheels}")
    return wheels[0]


def install(args: argparse.Namespace, wheel: Optional[Path]) -> None:
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check"]
    if wheel is None:
        run(pip + ["--no-build-isolation", "-e", str(ROOT)], "install", env=setup_env())
    else:
        run(pip + ["--force-reinstall", str(wheel)], "install")


def describe_module(path: Path) -> dict:
    """build_info() of the module at path, read in a fresh interpreter (the way users will)."""
    code = ("import importlib.util, json, sys\n"
            "spec = importlib.util.spec_from_file_location('tensorrt_llm.bindings', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(json.dumps(m.build_info()))\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        raise StageFailed("check", out.returncode, f"the built module {path} does not import")
    return json.loads(out.stdout)


def main(argv: Optional[Sequence[str]] = None) -> int:
    total_start = time.perf_counter()
    args = parse_args(argv)
    stages = Stages()
    jobs = args.job_count or default_job_count()

    nvcc = None
    if not args.cpu_only:
        nvcc = find_nvcc()
        if nvcc is None:
            log("notice: nvcc not found ($CUDACXX, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): building the "
                "CPU-only bindings, without CUDA kernels")
    with stages("requirements"):
        ensure_build_requirements(args)
    log(f"python {sys.executable}; {'CUDA ' + args.cuda_architectures + ' via ' + nvcc if nvcc else 'CPU-only'}; "
        f"{jobs} job(s); build folder {args.build_dir}")

    with stages("configure"):
        generator = prepare_build_dir(args)
        run(configure_command(args, nvcc, generator), "configure")
    with stages("build"):
        run([find_tool("cmake"), "--build", str(args.build_dir), "--parallel", str(jobs)], "build")
    with stages("copy"):
        module = copy_module(args)
        info = describe_module(module)
    wheel = None
    if not args.skip_building_wheel:
        with stages("wheel"):
            wheel = build_wheel_file(args)
    if args.install:
        with stages("install"):
            install(args, wheel)

    total = time.perf_counter() - total_start
    manifest = {"argv": list(sys.argv[1:] if argv is None else argv), "python": sys.executable,
                "module": str(module), "wheel": str(wheel) if wheel else None, "build_info": info,
                "jobs": jobs, "stage_seconds": stages.times, "total_seconds": round(total, 2)}
    (args.build_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")

    archs = ", ".join(info["cuda_architectures"]) or "none"
    kind = f"CUDA {info['cuda_version']} kernels for {archs}" if info["cuda"] else "CPU-only (no CUDA kernels)"
    log(f"built tensorrt_llm {info['version']} ({info['git_commit'][:12]}), {kind}")
    log(f"module: {module.relative_to(ROOT)}")
    if wheel:
        log(f"wheel:  {wheel}")
    if args.install:
        log("installed " + ("(editable)" if wheel is None else wheel.name))
    log("times: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.times.items()) + f"; total {total:.1f} s")
    return 0


def cli(entry=main) -> int:
    """Runs entry(); a failed stage ends with one line under the tool's own output, no traceback."""
    try:
        return entry() or 0
    except StageFailed as e:
        print(f"build_wheel.py: {e.message or e.stage + ' failed'}", file=sys.stderr, flush=True)
        return e.code or 1
    except KeyboardInterrupt:
        print("build_wheel.py: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(cli())
