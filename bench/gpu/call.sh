#!/usr/bin/env bash
# The prepared device call (docs/benchmarks.md, "Fused kernels on a GPU"), in two halves.
#
#   bench/gpu/call.sh stage REF_GIT_DIR      # here, once: what the lent machine lacks, into .device/ (git-ignored)
#   bench/gpu/call.sh run [ARGS...]          # there, in the repository root: every part, its files to $OUT
#
# A lent GPU machine has python3 with torch, Triton and einops, and no package index: `stage` downloads the wheels
# the project and the reference need beyond those (cp312, manylinux x86_64) into .device/whl and writes the TRM
# reference (SamsungSAILMontreal/TinyRecursiveModels at REF_COMMIT, from a git directory or checkout of it) to
# .device/ref. The device tool carries `.device`. `run` installs the wheels under /tmp/site, makes the configs
# importable as the wheel names them (trm_sweeps_conf), and runs bench/gpu/session.py (ARGS go to it: --parts,
# --candidates): the candidates against the reference, the tile check, the gradient check, the winner's profile,
# a train.precision=bf16 run and the learning curves, each part within its budget (480 s in all), each part's
# JSON to $OUT even when another fails. Then, here: copy $OUT to bench/results/gpu_session_<gpu>/ and
# `python -m bench.gpu.docs bench/results/gpu_session_<gpu> --write` (docs/benchmarks.md's GPU rows). The call:
#   command: bench/gpu/call.sh run      carry: [".device"]      timeout_s: 540
set -euo pipefail
cd "$(dirname "$0")/../.."

REF_COMMIT=e7b6871  # the reference commit every fidelity and bench number of this project is against
# What the machine lacks: what the project's training imports, and the reference's pydantic; each at its pin in
# requirements.lock.
NEEDED='omegaconf|hydra-core|lion-pytorch|pydantic|pydantic_core|annotated-types|typing-inspection'

stage() {
  local ref_git=${1:?usage: bench/gpu/call.sh stage REF_GIT_DIR (a git directory or checkout of the TRM reference)}
  local exclude; exclude="$(git rev-parse --git-common-dir)/info/exclude"  # a worktree's .git is a file
  grep -qx '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >>"$exclude"
  rm -rf .device && mkdir -p .device/whl .device/ref
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .device/whl $(grep -E "^($NEEDED)==" requirements.lock)
  git --git-dir "$(git -C "$ref_git" rev-parse --absolute-git-dir 2>/dev/null || echo "$ref_git")" \
    archive "$REF_COMMIT" | tar -x -C .device/ref
  du -sh .device
}

run() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl
  ln -sfn "$PWD/conf" /tmp/site/trm_sweeps_conf
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader || true
  python3 -m bench.gpu.session --device cuda --ref .device/ref --ref-python python3 \
    --out-dir "${OUT:-bench/results/gpu_session}" "$@"
}

case "${1:-}" in
  stage) shift; stage "$@" ;;
  run) shift; run "$@" ;;
  *) echo "usage: bench/gpu/call.sh stage REF_GIT_DIR | run [gpu_session args]" >&2; exit 2 ;;
esac
