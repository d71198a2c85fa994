#!/usr/bin/env bash
# Dispatcher for the staged install scripts next to this file.
#
#   install.sh --base [--devel] --cmake [--version V] --cuda_toolkit --pytorch [--install_type pypi] ...
#
# Each component flag (--base, --cmake, --cuda_toolkit, --tensorrt, --pytorch) selects
# install_<component>.sh; the options that follow it, up to the next component flag, are passed
# to that script. Components run in the order given; the first failure stops the run.
# `install.sh --help` lists the components; `install.sh --pytorch --help` a script's options.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
COMPONENTS=(base cmake cuda_toolkit tensorrt pytorch)

usage() {
    sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo "components: ${COMPONENTS[*]}"
}

is_component() {
    local c
    for c in "${COMPONENTS[@]}"; do
        [[ "$1" == "--$c" ]] && return 0
    done
    return 1
}

if [[ $# -eq 0 || "$1" == "-h" || "$1" == "--help" ]]; then
    usage
    exit 0
fi
if ! is_component "$1"; then
    echo "install.sh: expected a component flag first, got '$1'" >&2
    usage >&2
    exit 2
fi

run_component() {
    local name="$1"
    shift
    local script="$HERE/install_${name}.sh"
    if [[ ! -f "$script" ]]; then
        echo "install.sh: $script is missing (copy it next to install.sh)" >&2
        exit 2
    fi
    echo "==> install_${name}.sh $*"
    local start=$SECONDS
    bash "$script" "$@"
    echo "<== install_${name}.sh: $((SECONDS - start)) s"
}

current=""
args=()
while [[ $# -gt 0 ]]; do
    if is_component "$1"; then
        if [[ -n "$current" ]]; then
            run_component "$current" "${args[@]+"${args[@]}"}"
        fi
        current="${1#--}"
        args=()
    else
        args+=("$1")
    fi
    shift
done
run_component "$current" "${args[@]+"${args[@]}"}"
