#!/usr/bin/env bash
# What a bare, offline GPU machine lacks for `python -m benchmarks.gpu_check`, built on the development machine:
#
#   bash benchmarks/gpu_prepare.sh          (from the project's root; ~1 minute the first time, seconds after)
#
# makes .gpu/ (git-ignored through .git/info/exclude; ~27 MB):
#   .gpu/tokenizer.json  the StarCoder tokenizer (../shared/tokenizers/starcoder/tokenizer.json)
#   .gpu/fineweb/, eval/ ../shared/data/fineweb's parquet files (8 MB) and ../shared/eval (5 MB): the small study's
#                        data and end-of-training eval sets (benchmarks/gpu_study.py)
#   .gpu/tokens/         a token folder of ../shared/data/fineweb made with `ladder-data prepare` and that tokenizer
#                        (~4.8M tokens); kept when it is complete and made with this tokenizer, else made again
#   .gpu/whl/            wheels of the pure-Python packages a bare GPU machine lacks (it has torch, triton,
#                        tokenizers, numpy, pyarrow, transformers; not omegaconf, datasets, dill, multiprocess,
#                        torchdata), at the versions of this machine's environment, and the peers' of gpu_check
#                        --peers (benchmarks/peers.py), pinned: torchtitan 0.2.2 (the newest whose imports torch
#                        2.11 has), tyro, docstring-parser, typeguard (tyro's); pip installs them into .gpu/site/
#                        there (gpu_lease.sh first thing; gpu_check.py when its imports need them)
#   .gpu/commit          this checkout's commit and whether tracked files differ from it, for the rows' record
# Then copy the checkout with .gpu/ to the GPU machine and, from its root: `python -m benchmarks.gpu_check --out DIR`.
# Knobs (environment): PY (.venv/bin/python), SHARED (../shared), PYVER (3.12: the GPU machine's Python),
# WHEELS (the packages to fetch as wheels: NAME at this environment's version, NAME==VERSION pinned).
set -euo pipefail
PY=${PY:-.venv/bin/python}
SHARED=${SHARED:-../shared}
PYVER=${PYVER:-3.12}
WHEELS=${WHEELS:-omegaconf datasets dill multiprocess torchdata \
  torchtitan==0.2.2 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1}
G=.gpu

[ -f pyproject.toml ] && [ -f benchmarks/gpu_check.py ] || { echo "gpu_prepare: run from the project's root" >&2; exit 2; }
[ -x "$PY" ] || { echo "gpu_prepare: no Python at $PY (set PY=...)" >&2; exit 2; }
for need in "$SHARED/tokenizers/starcoder/tokenizer.json" "$SHARED/data/fineweb" "$SHARED/eval"; do
  [ -e "$need" ] || { echo "gpu_prepare: $need not found (set SHARED=...)" >&2; exit 2; }
done

# git-ignored without touching the tracked .gitignore
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
mkdir -p "$G/whl"

cmp -s "$SHARED/tokenizers/starcoder/tokenizer.json" "$G/tokenizer.json" \
  || cp "$SHARED/tokenizers/starcoder/tokenizer.json" "$G/tokenizer.json"

# complete: the metadata (written last) is there, `ladder-data info` reads the folder through, and the folder was
# tokenized with this tokenizer (the sha256 the folder records, of the tokenizer's serialised JSON)
tokens_complete() {
  [ -f "$G/tokens/ladder_tokens.json" ] || return 1
  "$(dirname "$PY")/ladder-data" info "$G/tokens" > /dev/null 2>&1 || return 1
  "$PY" - "$G/tokens/ladder_tokens.json" "$G/tokenizer.json" <<'EOF'
import hashlib, json, sys
from tokenizers import Tokenizer
made = json.load(open(sys.argv[1]))["tokenizer"]["sha256"]
now = hashlib.sha256(Tokenizer.from_file(sys.argv[2]).to_str().encode("utf-8")).hexdigest()
sys.exit(made != now)
EOF
}
if tokens_complete; then
  echo "token folder: $G/tokens is complete, kept"
else
  rm -rf "$G/tokens"  # a partial or stale folder of ours (prepare refuses a non-empty one)
  "$(dirname "$PY")/ladder-data" prepare "$SHARED/data/fineweb" "$G/tokens" --tokenizer "$G/tokenizer.json" \
    --workers 2 2>&1 | grep -v "it/s\|shards/s" | tail -2
  tokens_complete || { echo "gpu_prepare: $G/tokens is not complete after ladder-data prepare" >&2; exit 1; }
fi

# the FineWeb sample the small study's recipes read from ../shared (benchmarks/gpu_study.py uses it there)
# and the local eval sets its end-of-training evaluation reads (../shared/eval, 5 MB)
mkdir -p "$G/fineweb"
for f in "$SHARED"/data/fineweb/*.parquet; do cmp -s "$f" "$G/fineweb/$(basename "$f")" || cp "$f" "$G/fineweb/"; done
rm -rf "$G/eval" && cp -r "$SHARED/eval" "$G/eval"

# one wheel per package at this environment's version (or the pinned one); a wheel already there is kept, other
# versions removed (all of them when they were fetched for another Python)
[ "$(cat "$G/whl/.python" 2>/dev/null)" = "$PYVER" ] || rm -f "$G"/whl/*.whl
echo "$PYVER" > "$G/whl/.python"
for p in $WHEELS; do
  case "$p" in
    *==*) v=${p#*==}; p=${p%%==*} ;;
    *) v=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p") \
         || { echo "gpu_prepare: $p is not installed in $PY's environment" >&2; exit 1; } ;;
  esac
  stem=$(echo "$p" | tr '-' '_')
  for old in "$G"/whl/"$stem"-*.whl; do
    case "$old" in "$G/whl/$stem-$v-"*|*'*'*) ;; *) rm -f "$old" ;; esac
  done
  ls "$G/whl/$stem-$v-"*.whl > /dev/null 2>&1 && continue
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$G/whl" "$p==$v" 2>&1 | grep -v "WARNING\|ignored" || true
  ls "$G/whl/$stem-$v-"*.whl > /dev/null 2>&1 || { echo "gpu_prepare: no wheel of $p==$v downloaded" >&2; exit 1; }
done

rm -rf "$G/site"  # pip installs the wheels there on the machine that needs them (gpu_lease.sh, gpu_check.py)
# the commit this checkout is at, for the rows: the GPU machine may receive a copy that is no git checkout
echo "$(git rev-parse HEAD) $(git diff --quiet HEAD -- && echo clean || echo dirty)" > "$G/commit"
ls "$G/whl"
du -sh "$G"
echo "next: copy the checkout with $G/ to the GPU machine; there, from its root: python -m benchmarks.gpu_check --out DIR"
