#!/usr/bin/env bash
# Rebuilds tests/reference_dataset/sudoku-extreme-3-aug-2 with the TRM reference's own, unmodified
# dataset/build_sudoku_dataset.py from the two CSVs in csv/. Run by hand, never by the tests (they must not need the
# network); README.md beside this script says when it was run and with what.
#
#   tests/reference_dataset/make_fixture.sh REF_CHECKOUT PYTHON
#
# REF_CHECKOUT: a directory holding the reference's dataset/ at commit e7b6871 (common.py and
#   build_sudoku_dataset.py), e.g. from `git archive e7b6871 dataset | tar -x -C REF_CHECKOUT`.
# PYTHON: an interpreter with the builder's imports (numpy, pydantic, argdantic, tqdm) and without huggingface_hub.
#
# The only thing replaced is the hub download: a stand-in `huggingface_hub` module, first on PYTHONPATH, whose
# hf_hub_download(repo, "<split>.csv", ...) returns the path of csv/<split>.csv. The builder shuffles with numpy's
# unseeded global RNG, so a rebuild draws other subsamples and augmentations (the tests check properties, not bytes).
set -euo pipefail
ref=$(cd "$1" && pwd)
python=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$here/sudoku-extreme-3-aug-2
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
mkdir "$stub/huggingface_hub"
cat >"$stub/huggingface_hub/__init__.py" <<EOF
import os


def hf_hub_download(repo_id, filename, repo_type=None, **kwargs):
    return os.path.join("$here/csv", filename)
EOF
rm -rf "$out"
cd "$ref"
PYTHONPATH="$stub" "$python" dataset/build_sudoku_dataset.py --output-dir "$out" --subsample-size 3 --num-aug 2
