#!/usr/bin/env bash
# Everything aisaac checks on a GPU, in one command (bench/README.md, "On a GPU"), for the `device` tool's machine:
#   run `bash bench/gpu_prep.sh` here first, then on the GPU machine, with `carry: [".gpu"]`:  bash bench/gpu_run.sh
# A lent GPU may allow one run of about 10 minutes, so the run cannot lose a figure (issue 48):
#   - summary.md is written first (the versions, the steps planned) and appended to by every step, as it ends, with its exit status,
#     its seconds and its figures: what ran, and how far, is in one file even if the run is cut short;
#   - every step has its own time limit (seconds, overridable), sent as SIGINT, so that pytest and bench/gpu_nb.py write their reports
#     (pytest's JUnit XML, the page) before they stop; a kill follows 15 s later;
#   - the graphs tables run one process each (a CUDA error that sticks to a process ends only its table); each prints every
#     measurement the moment it is made, and a graphed fit that fell back to eager is a row with its reason, not a failed table;
#   - pytest's per-test limit (T_TEST, 45 s) is below the step's, so a test that hangs fails alone and the step still reports.
# Steps (STEPS, default "tests graphs nb", about 8 minutes at most; `timeout_s: 570` in one `run`):
#   tests     the cuda-marked tests (tests/test_cuda.py, tests/test_monitors.py), 4 pytest workers          T_TESTS=120
#   graphs    bench/gpu.py --sections graphs --tables 4a, then 4b, then 4c, one process each (issues 41, 48): the tiny MLP eager,
#             graphed and graphed by hand, with the GPU time of one replay of each graph (CUDA events); the vision recipe for 5
#             epochs, eager and graphed, data on the GPU; the LM recipe's tokens/s                          T_4A=60 T_4B=100 T_4C=90
#   nb        the GPU page, bench/gpu_page.ipynb, with its `cuda` cells, by bench/gpu_nb.py (execnb) into $OUT/gpu.ipynb, written after
#             every cell and at the end; it becomes nbs/tutorials/gpu.ipynb (bench/README.md, "On a GPU")  T_NB=150 (a cell: T_CELL=100)
#   not by default:
#   cputests  the CPU tests of CUDAGraphCB and DeviceLoader (tests/test_graphs.py, tests/test_devicedata.py)  T_CPUTESTS=60
#   lm        bench/lm.py on the GPU: the language-model recipe, bf16, 200 steps, against the hand-written loop  T_LM=60
#   bench     bench/gpu.py's tables 1 to 3, one process each: the loop's per-batch cost, the vision recipe per precision, the data
#             paths                                                                                            T_BENCH=200 (each)
#   suite     the whole suite, the GPU the default device, 8 workers (not the docs', notebooks' and layout tests)  T_SUITE=200
# Outputs, in $OUT (the device tool's) or else ./out/gpu: summary.md, env.txt, cuda_tests.txt and .xml, graphs_4a.txt, graphs_4b.txt,
# graphs_4c.txt, gpu.ipynb and gpu_nb.txt, [graph_cpu_tests.txt, lm_bench.txt, gpu_bench_{loop,recipe,data}.txt, suite.txt].
# EXTRA_PYTEST adds pytest arguments (e.g. `-k vision`), GRAPHS_ARGS gpu.py's (e.g. `--quick`), GPU_BENCH_ARGS those of step bench.
# DRY=1: the dry run on a CPU (tests/test_gpu_run.py): every step runs its CPU part (the cuda tests skip, the graphs tables say
# "GPU only", the page runs without its `cuda` and `hide` cells), to show that each leaves its file; no figure.
set -u
cd "$(dirname "$0")/.."
out="${OUT:-out/gpu}"; mkdir -p "$out"
steps="${STEPS:-tests graphs nb}"
dry="${DRY:-}"
sum="$out/summary.md"
t0=$(date +%s)
stamp() { echo "# --- $1 at +$(( $(date +%s) - t0 )) s"; }
note() { echo "$@" >> "$sum"; }
# run NAME LIMIT FILE CMD...: the step's command under its time limit (SIGINT, then a kill), its output to FILE; its exit status,
# seconds and the lines of FILE that `figures` picks appended to the summary
run() {
  local name=$1 limit=$2 file=$3; shift 3
  stamp "$name"
  local s=$(date +%s)
  timeout -s INT -k 15 "$limit" "$@" >"$file" 2>&1
  local rc=$?
  local why=""; [ $rc = 124 ] && why=" (stopped at its limit, ${limit} s)"; [ $rc = 137 ] && why=" (killed after its limit, ${limit} s)"
  echo "$name exit $rc$why"
  { echo; echo "## $name: exit $rc$why, $(( $(date +%s) - s )) s, $(basename "$file")"; echo; figures "$file"; } >> "$sum"
  tail -40 "$file"
}
# the lines of a step's output worth a look in the summary: tables, targets, pytest's counts and failures, a page's cells that failed
figures() { grep -E '^\||^- target|^- inside|^- the losses|^## |FAILED|ERROR|EAGER|[0-9]+ (passed|failed|skipped)|^saved |^  cell |Traceback' "$1" | head -80; }

{ echo "# aisaac on a GPU: bench/gpu_run.sh$( [ -n "$dry" ] && echo ' (DRY: a CPU dry run, no figures)' )"
  echo; echo "started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), steps: $steps"; } > "$sum"

if [ -d .gpu/whl ] && ! python3 -c "import fastcore, torcheval, fastprogress" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || { note "wheels: install FAILED"; exit 1; }
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
[ -d .gpu/fashion-mnist ] && export AISAAC_DATA="$PWD/.gpu/fashion-mnist"
[ -d .gpu/fortunes ] && export AISAAC_TEXT="$PWD/.gpu/fortunes"
[ -z "$dry" ] && nvidia-smi -L
py="${PYTHON:-python3}"
"$py" - <<'EOF' 2>&1 | tee "$out/env.txt"
import importlib, platform, torch
print('python', platform.python_version(), '| torch', torch.__version__, '| CUDA', torch.version.cuda, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')
for m in ('numpy', 'pyarrow', 'fsspec', 'datasets', 'huggingface_hub', 'tokenizers', 'accelerate', 'fastcore', 'torcheval', 'fastprogress'):
    try: print(f'{m} {importlib.import_module(m).__version__}', end='; ')
    except Exception as e: print(f'{m} FAILED {e!r}', end='; ')
print()
import aisaac.all; print('aisaac.all imports')
EOF
{ echo; echo '```'; cat "$out/env.txt"; echo '```'; } >> "$sum"

dev=cuda; [ -n "$dry" ] && dev=cpu
has() { [[ " $steps " == *" $1 "* ]]; }
if has tests; then
  opts=""  # 4 workers and a per-test limit where the plugins are there (the GPU image has both)
  [ -z "$dry" ] && "$py" -c "import xdist" 2>/dev/null && opts="$opts -n 4"  # (not in a dry run: the cuda tests skip, workers would only cost)
  "$py" -c "import pytest_timeout" 2>/dev/null && opts="$opts --timeout ${T_TEST:-45}"
  run tests "${T_TESTS:-120}" "$out/cuda_tests.txt" "$py" -m pytest -m cuda tests/test_cuda.py tests/test_monitors.py -rs -v -p no:cacheprovider \
    $opts --durations=15 --junitxml="$out/cuda_tests.xml" ${EXTRA_PYTEST:-}
fi
if has cputests; then
  opts=""; "$py" -c "import xdist" 2>/dev/null && opts="-n 4"
  run cputests "${T_CPUTESTS:-60}" "$out/graph_cpu_tests.txt" "$py" -m pytest tests/test_graphs.py tests/test_devicedata.py -q -p no:cacheprovider $opts
fi
if has graphs; then
  for t in 4a 4b 4c; do
    lim=$(eval echo "\${T_${t^^}:-}"); [ -z "$lim" ] && lim=$([ $t = 4a ] && echo 60 || ([ $t = 4b ] && echo 100 || echo 90))
    run "graphs $t" "$lim" "$out/graphs_$t.txt" "$py" bench/gpu.py --device $dev --sections graphs --tables $t ${GRAPHS_ARGS:-}
  done
fi
if has nb; then
  skip="--skip cuda --skip hide"; [ -z "$dry" ] && skip=""
  run nb "${T_NB:-150}" "$out/gpu_nb.txt" "$py" bench/gpu_nb.py bench/gpu_page.ipynb "$out/gpu.ipynb" --cell-timeout "${T_CELL:-100}" $skip
fi
if has lm; then
  lm_args="--device cuda --batches 200 --repeats 3"; [ -n "$dry" ] && lm_args="--device cpu --batches 2 --repeats 1"
  run lm "${T_LM:-60}" "$out/lm_bench.txt" "$py" bench/lm.py $lm_args
fi
if has bench; then
  for s in loop recipe data; do
    run "bench $s" "${T_BENCH:-200}" "$out/gpu_bench_$s.txt" "$py" bench/gpu.py --device $dev --sections $s $([ -n "$dry" ] && echo --quick) ${GPU_BENCH_ARGS:-}
  done
fi
if has suite; then
  opts=""; "$py" -c "import xdist" 2>/dev/null && opts="-n 8"
  run suite "${T_SUITE:-200}" "$out/suite.txt" "$py" -m pytest tests -q -p no:cacheprovider $opts --ignore=tests/test_docs.py \
    --ignore=tests/test_notebooks.py --ignore=tests/test_layout.py -rfEs
fi
stamp end
note ""; note "ended at +$(( $(date +%s) - t0 )) s"
