#!/usr/bin/env bash
# Everything aisaac checks on a GPU, in one command (bench/README.md, "On a GPU"), for the `device` tool's machine:
#   run `bash bench/gpu_prep.sh` here first, then on the GPU machine, with `carry: [".gpu"]`:  bash bench/gpu_run.sh
# Steps, each with its own time limit so that one slow step cannot eat the others' time (seconds, overridable):
#   1. tests: the cuda-marked tests (tests/test_cuda.py, tests/test_monitors.py), 4 pytest workers, then the CPU tests of
#      CUDAGraphCB and DeviceLoader (tests/test_graphs.py, tests/test_devicedata.py, 40 s at most; step `cputests`, not a default)   T_TESTS=120
#   2. graphs: bench/gpu.py --sections graphs: whole-step CUDA graphs (issue 41): the tiny MLP eager, graphed and graphed by
#      hand; the vision recipe for 5 epochs, eager and graphed, data on the GPU; the LM recipe's tokens/s   T_GRAPHS=160
#   nb: the GPU page, bench/gpu_page.ipynb, run with its `cuda` cells by bench/gpu_nb.py (execnb) into $OUT/gpu.ipynb,
#      which becomes nbs/tutorials/gpu.ipynb once it is saved from a GPU (bench/README.md, "On a GPU")   T_NB=110
#   3. lm: bench/lm.py on the GPU: the language-model recipe, bf16, 200 steps, against the hand-written loop   T_LM=60
#   4. bench: bench/gpu.py: the loop's per-batch cost, the vision recipe per precision, the data paths   T_BENCH=200
#   5. suite: the whole suite, where the default device is the GPU, 8 workers   T_SUITE=200
#      (not the docs', notebooks' and layout tests: nbdev and Jupyter are not on the GPU image)
# The default, STEPS="tests graphs nb", takes at most 14 + 120 + 160 + 110 s: `timeout_s: 420` in one `run` leaves time to rerun.
# Outputs (in $OUT when the device tool runs it, else ./out/gpu): cuda_tests.txt and .xml, graphs_bench.txt, lm_bench.txt,
# gpu_bench.txt, suite.txt. STEPS="tests lm bench" picks steps; EXTRA_PYTEST adds pytest arguments (e.g. `-k vision`).
set -u
cd "$(dirname "$0")/.."
out="${OUT:-out/gpu}"; mkdir -p "$out"
steps="${STEPS:-tests graphs nb}"
t0=$(date +%s)
stamp() { echo "# --- $1 at +$(( $(date +%s) - t0 )) s"; }

if [ -d .gpu/whl ] && ! python3 -c "import fastcore, torcheval, fastprogress" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
[ -d .gpu/fashion-mnist ] && export AISAAC_DATA="$PWD/.gpu/fashion-mnist"
[ -d .gpu/fortunes ] && export AISAAC_TEXT="$PWD/.gpu/fortunes"
nvidia-smi -L
python3 - <<'EOF' 2>&1 | tee "$out/env.txt"
import importlib, platform, torch
print('python', platform.python_version(), '| torch', torch.__version__, '| CUDA', torch.version.cuda, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')
for m in ('numpy', 'pyarrow', 'fsspec', 'datasets', 'huggingface_hub', 'tokenizers', 'accelerate', 'fastcore', 'torcheval', 'fastprogress'):
    try: print(f'{m} {importlib.import_module(m).__version__}', end='; ')
    except Exception as e: print(f'{m} FAILED {e!r}', end='; ')
print()
import aisaac.all; print('aisaac.all imports')
EOF

if [[ " $steps " == *" tests "* ]]; then
  stamp tests
  opts=""  # 4 workers and a per-test limit where the plugins are there (the GPU image has both)
  python3 -c "import xdist" 2>/dev/null && opts="$opts -n 4"
  python3 -c "import pytest_timeout" 2>/dev/null && opts="$opts --timeout 200"
  timeout "${T_TESTS:-120}" python3 -m pytest -m cuda tests/test_cuda.py tests/test_monitors.py -rs -v -p no:cacheprovider \
    $opts --durations=15 --junitxml="$out/cuda_tests.xml" ${EXTRA_PYTEST:-} >"$out/cuda_tests.txt" 2>&1
  echo "tests exit $?"; grep -E "FAILED|ERROR|SKIP|[0-9]+ (passed|failed)" "$out/cuda_tests.txt" | tail -40
fi
if [[ " $steps " == *" cputests "* ]]; then
  stamp cputests
  timeout 40 python3 -m pytest tests/test_graphs.py tests/test_devicedata.py -q -p no:cacheprovider -n 4 >"$out/graph_cpu_tests.txt" 2>&1
  echo "graph CPU tests exit $?"; tail -3 "$out/graph_cpu_tests.txt"
fi
if [[ " $steps " == *" graphs "* ]]; then
  stamp graphs
  timeout "${T_GRAPHS:-160}" python3 bench/gpu.py --sections graphs ${GRAPHS_ARGS:-} >"$out/graphs_bench.txt" 2>&1
  echo "graphs exit $?"; cat "$out/graphs_bench.txt"
fi
if [[ " $steps " == *" nb "* ]]; then
  stamp nb
  timeout "${T_NB:-110}" python3 bench/gpu_nb.py bench/gpu_page.ipynb "$out/gpu.ipynb" >"$out/gpu_nb.txt" 2>&1
  echo "nb exit $?"; tail -30 "$out/gpu_nb.txt"
fi
if [[ " $steps " == *" lm "* ]]; then
  stamp lm
  timeout "${T_LM:-60}" python3 bench/lm.py --device cuda --batches 200 --repeats 3 >"$out/lm_bench.txt" 2>&1
  echo "lm exit $?"; tail -8 "$out/lm_bench.txt"
fi
if [[ " $steps " == *" bench "* ]]; then
  stamp bench
  timeout "${T_BENCH:-200}" python3 bench/gpu.py ${GPU_BENCH_ARGS:-} >"$out/gpu_bench.txt" 2>&1
  echo "bench exit $?"; cat "$out/gpu_bench.txt"
fi
if [[ " $steps " == *" suite "* ]]; then
  stamp suite
  opts=""; python3 -c "import xdist" 2>/dev/null && opts="-n 8"
  timeout "${T_SUITE:-200}" python3 -m pytest tests -q -p no:cacheprovider $opts --ignore=tests/test_docs.py \
    --ignore=tests/test_notebooks.py --ignore=tests/test_layout.py -rfEs >"$out/suite.txt" 2>&1
  echo "suite exit $?"; grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$out/suite.txt" | tail -40
fi
stamp end
