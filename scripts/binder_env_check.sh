#!/usr/bin/env bash
# Build the Binder environment from binder/ in a fresh virtual environment and run
# notebook 00 in it, then grades notebook 13 from a work folder (a solved copy full marks,
# the released copy zero), as a stand-in for repo2docker (which cannot run here).
#
#     BINDER_TORCH=local bash scripts/binder_env_check.sh   # slow: downloads every package
#     (17 min measured on a shared, heavily loaded 2-core machine; mostly pip)
#
# Python: the version binder/runtime.txt names (python3.X must be on PATH, or set PYTHON).
# PyTorch: Binder installs binder/requirements.txt (the CPU wheel index). Where that index is
# not reachable, BINDER_TORCH=local installs the same torch version with a plain
# `pip install torch==X` (the machine's own CPU build), then the rest of requirements.txt.
# Everything else runs binder/postBuild unchanged. HOME and the Jupyter directories are
# temporary, so the user's configuration is never read or written. Not run by CI (slow).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

runtime=$(tr -d '[:space:]' < binder/runtime.txt)          # e.g. python-3.11
version=${runtime#python-}
python=${PYTHON:-python$version}
"$python" -c "import sys; assert sys.version.startswith('$version.'), sys.version" \
    || { echo "binder/runtime.txt asks for Python $version; $python is not it" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/binder-env-check.XXXXXX")
echo "+ building in $work"
export HOME="$work/home" JUPYTER_CONFIG_DIR="$work/jupyter-config" \
       JUPYTER_DATA_DIR="$work/jupyter-data" JUPYTER_RUNTIME_DIR="$work/jupyter-runtime" \
       IPYTHONDIR="$work/ipython" MPLCONFIGDIR="$work/matplotlib" \
       DISTLAB_FLASHCARDS_DB="$work/flashcards.sqlite3"
unset PYTHONPATH JUPYTER_PATH JUPYTER_CONFIG_PATH
mkdir -p "$HOME"
"$python" -m venv "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
python -m pip install --quiet --upgrade pip

if [ "${BINDER_TORCH:-binder}" = local ]; then
    torch=$(grep -E '^torch==' binder/requirements.txt | sed -E 's/\+cpu$//')
    echo "+ pip install $torch   (BINDER_TORCH=local)"
    python -m pip install --quiet "$torch"
    grep -vE '^(torch==|--extra-index-url|--index-url)' binder/requirements.txt \
        > "$work/requirements-rest.txt"
    python -m pip install --quiet -r "$work/requirements-rest.txt"
else
    python -m pip install --quiet -r binder/requirements.txt
fi

echo "+ binder/postBuild"
# the committed tree, as repo2docker builds from a commit (pip install . writes build/)
mkdir -p "$work/repo"
git -C "$repo" archive HEAD | tar -x -C "$work/repo"
cd "$work/repo"
bash binder/postBuild

echo "+ the learner's side of nbgrader only"
extensions=$(jupyter labextension list 2>&1)
echo "$extensions" | sed -n '/Disabled extensions:/,$p'     # lists disabled plugins only
for plugin in formgrader create-assignment course-list assignment-list; do
    echo "$extensions" | grep -qE "@jupyter/nbgrader:$plugin\b" \
        || { echo "@jupyter/nbgrader:$plugin is not listed as disabled" >&2; exit 1; }
done
for plugin in validate-assignment; do
    if echo "$extensions" | grep -qE "@jupyter/nbgrader:$plugin\b"; then
        echo "@jupyter/nbgrader:$plugin is disabled" >&2; exit 1
    fi
done

echo "+ notebook 00 in the Binder environment"
notebook=course/00-launching/00-launching.ipynb
python -m jupyter nbconvert --to notebook --execute --allow-errors \
    --ExecutePreprocessor.timeout=600 --output-dir "$work/executed" "$notebook"
python - "$work/executed/00-launching.ipynb" <<'PY'
import sys

import nbformat

nb = nbformat.read(sys.argv[1], as_version=4)
code = [c for c in nb.cells if c.cell_type == "code"]
errors = [(i, o.ename) for i, c in enumerate(code) for o in c.outputs if o.output_type == "error"]
unexpected = [e for e in errors if e[1] != "NotImplementedError"]
not_run = [i for i, c in enumerate(code) if c.source.strip() and c.execution_count is None]
print(f"{len(code)} code cells, errors in {[i for i, _ in errors]} (unsolved exercises)")
if unexpected or not_run:
    sys.exit(f"unexpected errors {unexpected}, cells not run {not_run}")
PY
echo "+ distlab grade from a work folder, with the package postBuild installed (no clone)"
mkdir -p "$work/learner"
for copy in solutions course; do
    cp "$copy/13-sharded-matmuls-and-overlap/13-sharded-matmuls-and-overlap.ipynb" "$work/learner/"
    (cd "$work/learner" && distlab grade 13) > "$work/grade-$copy.txt" || true
    head -1 "$work/grade-$copy.txt"
done
grep -q "^13-sharded-matmuls-and-overlap: 8 / 8 points" "$work/grade-solutions.txt" \
    || { echo "a solved copy did not earn full marks" >&2; exit 1; }
grep -q "^13-sharded-matmuls-and-overlap: 0 / 8 points" "$work/grade-course.txt" \
    || { echo "the released copy did not score zero" >&2; exit 1; }
echo "binder environment OK ($work)"
