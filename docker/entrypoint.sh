#!/usr/bin/env bash
# Entry point of the tensorrt_llm release image.
#
# Volumes (docker/Makefile's release_run mounts them):
#   /models    MODELS_DIR: your models, read only: a llama.cpp .gguf file, or a Hugging Face
#              folder (config.json + *.safetensors + tokenizer files)
#   /engines   ENGINES_DIR: what this image writes, one folder per model:
#              /engines/<name>/checkpoint   the converted checkpoint (config, weights, tokenizer)
#              /engines/<name>/engine       the built engine (config.json + rank*.engine)
#
# Commands (the container's arguments; `make -C docker release_run CMD="..."`):
#   help                      this text
#   e2e [options] [-- trtllm-build options]
#                             convert a model from /models, build its engine into /engines and
#                             generate text with it. An engine already in /engines that this
#                             tensorrt_llm version can run is reused: nothing is converted or
#                             rebuilt. One built by another version (engines record the version
#                             that built them; the runtime refuses a mismatch) is rebuilt from
#                             the model, with a message naming both versions.
#       --model PATH          a .gguf file or a Hugging Face folder (default: the only model
#                             in /models)
#       --name NAME           the folder under /engines (default: the model's name)
#       --dtype DTYPE         checkpoint dtype: float32 (default), float16, bfloat16
#       --prompt TEXT         (default: "What is the capital of France?")
#       --max_output_len N    (default: 32)
#       --rebuild             convert and build even when a usable engine exists
#       --no_run              stop after building
#     trtllm-build options default to: --max_batch_size 2 --max_input_len 256 --max_seq_len 512
#   serve MODEL [trtllm-serve options]
#                             serve MODEL (a .gguf file or Hugging Face folder under /models, or
#                             an engine folder) over the OpenAI API on port 8000 of every
#                             interface of the container: publish it with PORT=8000 (make
#                             release_run). A model is built once into /engines/cache
#                             ($TRTLLM_CACHE_DIR) and reused by later runs. SIGTERM (docker stop)
#                             lets the running requests finish and exits 0.
#   info                      the package version, PyTorch, GPU and the compiled kernels
#   anything else             run as a command, e.g. `bash`, `trtllm-build --help`,
#                             `python examples/run.py --engine_dir /engines/x/engine ...`
set -euo pipefail

EXAMPLES=/app/tensorrt_llm/examples
MODELS=${MODELS_DIR:-/models}
ENGINES=${ENGINES_DIR:-/engines}

log() { echo "[trtllm] $*"; }
die() { echo "[trtllm] error: $*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo pipefail$/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

package_version() {
    python -c 'import tensorrt_llm; print(tensorrt_llm.__version__)'
}

info() {
    python - <<'EOF'
import json
import torch
import tensorrt_llm
from tensorrt_llm import bindings
print("tensorrt_llm", tensorrt_llm.__version__)
print("torch", torch.__version__, "(CUDA", torch.version.cuda, ")")
print("GPU:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible")
print("kernels:", json.dumps(bindings.build_info()))
EOF
}

# Prints nothing and succeeds when $1 holds an engine this runtime can load; otherwise prints
# why (the runtime's own message, naming both versions on a mismatch) and fails.
engine_problem() {
    python - "$1" <<'EOF'
import sys
from tensorrt_llm.engine import read_engine_config
from tensorrt_llm.errors import EngineError
try:
    read_engine_config(sys.argv[1])
except EngineError as e:
    print(e)
    sys.exit(1)
EOF
}

find_default_model() {
    local found=()
    local f
    shopt -s nullglob
    for f in "$MODELS"/*.gguf "$MODELS"/*/config.json; do
        if [[ "$f" == */config.json ]]; then
            found+=("$(dirname "$f")")
        else
            found+=("$f")
        fi
    done
    shopt -u nullglob
    if [[ ${#found[@]} -eq 0 ]]; then
        die "no model in $MODELS (expected a .gguf file or a Hugging Face folder with config.json;" \
            "mount one with MODELS_DIR=/abs/path, or pass --model)"
    fi
    if [[ ${#found[@]} -gt 1 ]]; then
        die "several models in $MODELS (${found[*]}): choose one with --model"
    fi
    echo "${found[0]}"
}

e2e() {
    local model="" name="" dtype=float32 prompt="What is the capital of France?" max_output_len=32
    local rebuild=0 run=1
    local build_args=(--max_batch_size 2 --max_input_len 256 --max_seq_len 512)
    local extra_build_args=()
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --model) model="$2"; shift 2 ;;
            --name) name="$2"; shift 2 ;;
            --dtype) dtype="$2"; shift 2 ;;
            --prompt) prompt="$2"; shift 2 ;;
            --max_output_len) max_output_len="$2"; shift 2 ;;
            --rebuild) rebuild=1; shift ;;
            --no_run) run=0; shift ;;
            --) shift; extra_build_args=("$@"); break ;;
            *) die "e2e: unknown option $1 (see: help)" ;;
        esac
    done
    if [[ ${#extra_build_args[@]} -gt 0 ]]; then
        build_args=("${extra_build_args[@]}")
    fi
    [[ -n "$model" ]] || model="$(find_default_model)"
    [[ -e "$model" ]] || die "model $model not found (is MODELS_DIR mounted at $MODELS?)"
    if [[ -z "$name" ]]; then
        name="$(basename "$model")"
        name="${name%.gguf}"
    fi
    [[ -d "$ENGINES" && -w "$ENGINES" ]] || die "$ENGINES is not a writable folder (mount ENGINES_DIR;" \
        "with LOCAL_USER=1 it must belong to you)"

    local work="$ENGINES/$name" version
    local ckpt="$work/checkpoint" engine="$work/engine"
    version="$(package_version)"
    log "tensorrt_llm $version; model $model; engine folder $work"

    local need_build=1 problem
    if [[ "$rebuild" == 0 && -f "$engine/config.json" ]]; then
        if problem="$(engine_problem "$engine")"; then
            need_build=0
            log "found an existing engine in $engine built by tensorrt_llm $version: reusing it, skipping conversion and build"
        else
            log "existing engine in $engine cannot be used: $problem"
            log "rebuilding it with tensorrt_llm $version"
        fi
    fi

    if [[ "$need_build" == 1 ]]; then
        mkdir -p "$work"
        local tmp="$work/.tmp.$$"
        rm -rf "$tmp"
        mkdir -p "$tmp"
        local convert=(python "$EXAMPLES/llama/convert_checkpoint.py" --output_dir "$tmp/checkpoint" --dtype "$dtype")
        if [[ -d "$model" ]]; then
            convert+=(--model_dir "$model")
        else
            convert+=(--gguf_file "$model")
        fi
        log "converting: ${convert[*]}"
        local t0=$SECONDS
        "${convert[@]}"
        log "converted in $((SECONDS - t0)) s"
        t0=$SECONDS
        log "building: trtllm-build --checkpoint_dir $tmp/checkpoint --output_dir $tmp/engine ${build_args[*]}"
        python -m tensorrt_llm.commands.build --checkpoint_dir "$tmp/checkpoint" --output_dir "$tmp/engine" \
            "${build_args[@]}"
        log "built in $((SECONDS - t0)) s"
        # Replace the old results only once both are complete: an interrupted run leaves
        # the previous engine (or nothing), never half of one.
        rm -rf "$ckpt" "$engine"
        mv "$tmp/checkpoint" "$ckpt"
        mv "$tmp/engine" "$engine"
        rmdir "$tmp"
        log "engine written to $engine"
    fi

    if [[ "$run" == 1 ]]; then
        log "running: examples/run.py --engine_dir $engine --tokenizer_dir $ckpt"
        python "$EXAMPLES/run.py" --engine_dir "$engine" --tokenizer_dir "$ckpt" \
            --input_text "$prompt" --max_output_len "$max_output_len"
    fi
}

serve() {
    [[ $# -ge 1 ]] || die "serve: name a model, e.g. serve /models/model.gguf (see: help)"
    # Built engines go to the engines volume, so that the next container finds them.
    export TRTLLM_CACHE_DIR="${TRTLLM_CACHE_DIR:-$ENGINES/cache}"
    # The host and port first: options given after MODEL override them.
    exec trtllm-serve --host 0.0.0.0 --port 8000 "$@"
}

cmd="${1:-help}"
case "$cmd" in
    help|-h|--help) usage ;;
    info) info ;;
    e2e) shift; e2e "$@" ;;
    serve) shift; serve "$@" ;;
    *) exec "$@" ;;
esac
