"""build_wheel.py: its decisions (unit tests), the CPU-only CMake build, and the results of the last
`python build_wheel.py` run (`make test` runs it first): a no-op rebuild, the wheel in a fresh
virtual environment, and the GPU code in the module (cuobjdump)."""
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "cpp" / "build" / "build_wheel.json"

spec = importlib.util.spec_from_file_location("build_wheel", ROOT / "build_wheel.py")
bw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bw)


def last_build() -> dict:
    """The manifest build_wheel.py wrote for its last run in cpp/build."""
    if not MANIFEST.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{MANIFEST} missing: CI must run build_wheel.py before the tests (make test does)")
        pytest.skip("no build_wheel.py run in cpp/build yet (make test runs one)")
    return json.loads(MANIFEST.read_text())


# ---- decisions ----

def test_default_job_count_is_bounded_by_memory_and_cores():
    assert bw.default_job_count(cores=2, memory=24 * bw.GIB) == 2
    assert bw.default_job_count(cores=16, memory=20 * bw.GIB) == 5
    assert bw.default_job_count(cores=8, memory=1 * bw.GIB) == 1
    assert bw.default_job_count(cores=4, memory=None) in (4, bw.default_job_count(cores=4))
    assert 1 <= bw.default_job_count() <= bw.cpu_count()


def test_arguments():
    args = bw.parse_args([])
    assert args.cuda_architectures == "80-real;90-real" and args.build_type == "Release"
    assert args.build_dir == ROOT / "cpp" / "build" and not args.cpu_only and args.job_count is None
    args = bw.parse_args(["-a", "native", "-j", "3", "-c", "-s", "-i", "--use_ccache", "-D", "A=1", "-D", "B=x y",
                          "--build_dir", "/tmp/b", "--dist_dir", "/tmp/d", "-b", "Debug", "--cpu_only"])
    assert (args.cuda_architectures, args.job_count, args.clean, args.skip_building_wheel, args.install) == \
        ("native", 3, True, True, True)
    assert args.extra_cmake_vars == ["A=1", "B=x y"] and args.build_type == "Debug" and args.cpu_only
    for bad in (["-j", "0"], ["-D", "NOVALUE"], ["-b", "Fast"]):
        with pytest.raises(SystemExit):
            bw.parse_args(bad)


def test_find_nvcc(tmp_path):
    assert bw.find_nvcc({"PATH": str(tmp_path)}, fallbacks=()) is None
    fake = tmp_path / "bin" / "nvcc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert bw.find_nvcc({"PATH": str(fake.parent)}, fallbacks=()) == str(fake)
    assert bw.find_nvcc({"PATH": "", "CUDA_HOME": str(tmp_path)}, fallbacks=()) == str(fake)
    assert bw.find_nvcc({"PATH": "", "CUDACXX": str(fake)}, fallbacks=()) == str(fake)


def _fake_tool(folder: Path, name: str, version_line: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / name
    tool.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    tool.chmod(0o755)
    return tool


def test_build_tools_found_in_this_pythons_scripts_folder(tmp_path, monkeypatch):
    """A venv's pip-installed cmake/ninja are used when PATH has none, or only a too old cmake."""
    scripts = tmp_path / "venv-bin"
    monkeypatch.setattr(bw, "scripts_dir", lambda: scripts)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert bw.find_tool("cmake") is None and bw.find_tool("ninja") is None
    assert {"cmake>=3.24", "ninja"} <= set(bw.missing_build_requirements())
    local_cmake = _fake_tool(scripts, "cmake", "cmake version 3.31.6")
    _fake_tool(scripts, "ninja", "1.13.0")
    assert bw.find_tool("cmake") == str(local_cmake)
    assert not {"cmake>=3.24", "ninja"} & set(bw.missing_build_requirements())
    old = _fake_tool(tmp_path / "usr-bin", "cmake", "cmake version 3.18.4")
    monkeypatch.setenv("PATH", str(old.parent))
    assert bw.find_tool("cmake") == str(local_cmake)  # the old one on PATH is passed over
    local_cmake.unlink()
    assert bw.find_tool("cmake") == str(old) and "cmake>=3.24" in bw.missing_build_requirements()


def test_missing_build_requirements_stop_with_the_pip_command(monkeypatch):
    monkeypatch.setattr(bw, "missing_build_requirements", lambda need_setuptools=True: ["pybind11>=2.12"])
    with pytest.raises(bw.StageFailed, match=r"lacks pybind11>=2.12: .* -m pip install 'pybind11>=2.12'"):
        bw.ensure_build_requirements(bw.parse_args([]))
    assert bw.version_tuple("2.13.6") == (2, 13, 6) and bw.version_tuple("3.24.0-rc1") == (3, 24, 0)
    assert bw.version_tuple("70.1.0.post1") >= (70, 1)


def test_configure_command_cuda_and_cpu_only():
    args = bw.parse_args(["-a", "90-real", "-D", "FOO=1"])
    cuda = bw.configure_command(args, "/opt/cuda/bin/nvcc", "Ninja")
    assert "-DTRTLLM_CUDA=ON" in cuda and "-DCMAKE_CUDA_ARCHITECTURES=90-real" in cuda
    assert "-DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc" in cuda and cuda[-1] == "-DFOO=1"
    assert f"-DPython_EXECUTABLE={sys.executable}" in cuda
    cpu = bw.configure_command(args, None, "Ninja")
    assert "-DTRTLLM_CUDA=OFF" in cpu and not any("CUDA_ARCHITECTURES" in c for c in cpu)


def test_failing_stage_reports_the_tool_output_not_a_traceback(tmp_path):
    bad = tmp_path / "CMakeLists.txt"
    bad.write_text("cmake_minimum_required(VERSION 3.24)\nproject(x CXX)\nmessage(FATAL_ERROR \"boom-from-cmake\")\n")
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('bw', {str(ROOT / 'build_wheel.py')!r})\n"
            "bw = importlib.util.module_from_spec(spec); spec.loader.exec_module(bw)\n"
            f"sys.exit(bw.cli(lambda: bw.run(['cmake', '-S', {str(tmp_path)!r}, '-B', {str(tmp_path / 'b')!r}],"
            " 'configure')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "boom-from-cmake" in proc.stderr + proc.stdout
    assert "build_wheel.py: configure failed" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- the CPU-only build (same CMake project, no CUDA) ----

def test_cpu_only_build(tmp_path):
    build = tmp_path / "build"
    args = bw.parse_args(["--cpu_only", "--build_dir", str(build)])
    jobs = str(bw.default_job_count())
    subprocess.run(bw.configure_command(args, None, "Ninja" if bw.find_tool("ninja") else "Unix Makefiles"),
                   check=True, capture_output=True)
    subprocess.run([bw.find_tool("cmake"), "--build", str(build), "--parallel", jobs], check=True,
                   capture_output=True)
    module = build / "tensorrt_llm" / bw.module_filename()
    info = bw.describe_module(module)
    assert info["cuda"] is False and info["cuda_version"] is None and info["cuda_architectures"] == []
    code = ("import importlib.util, sys, torch\n"
            "spec = importlib.util.spec_from_file_location('tensorrt_llm.bindings', sys.argv[1])\n"
            "b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)\n"
            "x = torch.ones(2, 4); a = lambda t: (t.data_ptr(), 0, tuple(t.shape), tuple(t.stride()), 0)\n"
            "try:\n    b.silu_and_mul(a(torch.ones(2, 2)), a(x), 0)\n"
            "except RuntimeError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(module)], capture_output=True, text=True, check=True)
    assert "refused: silu_and_mul" in out.stdout and "built without CUDA kernels" in out.stdout


# ---- the last build_wheel.py run ----

def sources_changed_since(path) -> list:
    """The C++/CUDA sources and build files modified after `path` was written."""
    cpp, built = ROOT / "cpp", path.stat().st_mtime
    files = [ROOT / "build_wheel.py",
             *(p for p in cpp.rglob("*") if p.is_file() and not p.relative_to(cpp).parts[0].startswith("build"))]
    return [p for p in files if p.stat().st_mtime > built]


def test_noop_rebuild_is_quick_and_compiles_nothing():
    build = last_build()
    # Right after a build (make test runs one first) a rebuild is a no-op; after an edit it is not.
    changed = sources_changed_since(MANIFEST)
    if changed:
        why = (f"{len(changed)} source file(s) changed since the last build_wheel.py run in cpp/build "
               f"(e.g. {changed[0].relative_to(ROOT)}): a rebuild would not be a no-op")
        if os.environ.get("CI"):
            pytest.fail(why + " (CI runs make test, which builds first)")
        pytest.skip(why)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "build_wheel.py"), *build["argv"]], cwd=ROOT,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert elapsed < 60, f"no-op rebuild took {elapsed:.1f} s"
    assert "Building CUDA object" not in proc.stdout and "bindings.cpp.o" not in proc.stdout, proc.stdout[-3000:]


def test_wheel_is_platform_tagged_and_holds_the_module():
    build = last_build()
    if not build["wheel"]:
        pytest.skip("the last build_wheel.py run made no wheel (-s)")
    wheel = Path(build["wheel"])
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert wheel.name.startswith(f"tensorrt_llm-{build['build_info']['version']}-{tag}-{tag}-linux_"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert f"tensorrt_llm/{bw.module_filename()}" in names
    assert "tensorrt_llm/kernels/ops.py" in names and "tensorrt_llm/version.py" in names
    assert not any(n.startswith(("cpp/", "tests/")) for n in names)


def test_wheel_in_a_fresh_virtual_environment(tmp_path):
    build = last_build()
    if not build["wheel"]:
        pytest.skip("the last build_wheel.py run made no wheel (-s)")
    venv = tmp_path / "venv"
    # torch & co. and pip itself come from the environment running this test (no download), listed
    # in a .pth file: `--system-site-packages` would give the base interpreter's packages instead,
    # which inside a venv are not these. The package itself comes only from the wheel.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    venv_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    outer = [p for p in site.getsitepackages() if Path(p).is_dir() and not p.startswith(str(venv))]
    (Path(venv_site) / "outer_environment.pth").write_text("\n".join(outer) + "\n")
    pip = [str(py), "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "-q"]
    # into the venv even when a tensorrt_llm is installed system-wide; then pip install again, which
    # resolves the wheel's requirements against what is installed
    subprocess.run(pip + ["--no-deps", "--force-reinstall", build["wheel"]], check=True)
    subprocess.run(pip + [build["wheel"]], check=True)
    code = ("import json, tensorrt_llm, tensorrt_llm.bindings as b, tensorrt_llm.kernels as k\n"
            "print(json.dumps([tensorrt_llm.__file__, b.build_info()]))\n")
    out = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    where, info = json.loads(out.stdout)
    assert where.startswith(str(venv)), where
    assert info == build["build_info"]
    scripts = subprocess.run([str(py), "-m", "pip", "show", "-f", "tensorrt_llm"], capture_output=True,
                             text=True, check=True).stdout
    assert "trtllm-build-info" in scripts
    info_cmd = subprocess.run([str(venv / "bin" / "trtllm-build-info")], cwd=tmp_path, capture_output=True,
                              text=True, check=True)
    assert json.loads(info_cmd.stdout)["bindings"] == info


def _cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    for base in sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]:
        candidate = Path(base) / "nvidia" / "cu13" / "bin" / "cuobjdump"
        if candidate.is_file():
            return str(candidate)
    return None


def test_module_holds_gpu_code_for_every_listed_architecture():
    build = last_build()
    info = build["build_info"]
    if not info["cuda"]:
        pytest.skip("CPU-only build")
    tool = _cuobjdump()
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("cuobjdump not found: pip install nvidia-cuda-cuobjdump (requirements-dev.txt)")
        pytest.skip("cuobjdump not found")
    listing = subprocess.run([tool, "--list-elf", build["module"]], capture_output=True, text=True,
                             check=True).stdout
    for arch in info["cuda_architectures"]:
        if arch.startswith("sm_"):
            for kernel_file in ("rms_norm", "rotary", "activation", "paged_kv"):
                assert f"{kernel_file}.{arch}.cubin" in listing, listing
