#!/usr/bin/env bash
# Prepare, on this machine, what the `device` tool's GPU machine lacks to run aisaac (bench/README.md, "On a GPU"):
#   .gpu/whl            wheels (Python 3.12) of aisaac's dependencies that the GPU image does not hold, and execnb's
#   .gpu/fashion-mnist  the four Fashion-MNIST IDX files (about 30 MB)
#   .gpu/fortunes       the language-model tutorial's corpus (Debian's fortune files, about 2 MB; `AISAAC_TEXT` points there)
# .gpu/ is ignored by git (.gitignore), so it travels only when a run names it in `carry`. Run this in the checkout that
# the device tool sends (the session's own), from anywhere: `bash bench/gpu_prep.sh`. It only adds what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu/whl .gpu/fashion-mnist .gpu/fortunes

data="${DATA_DIR:-/usr/share/datasets/fashion-mnist}"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  [ -f ".gpu/fashion-mnist/$f" ] || cp "$data/$f" .gpu/fashion-mnist/
done

text="${AISAAC_TEXT:-/usr/share/games/fortunes}"
for f in "$text"/*; do  # the fortune files proper: no extension (not the .dat indexes, not the .u8 links)
  case "$(basename "$f")" in *.*) ;; *) [ -f "$f" ] && cp -n "$f" .gpu/fortunes/ ;; esac
done

# aisaac's dependencies (fastcore, torcheval, datasets, fastprogress) and theirs, less what the GPU image holds
# (/work/.library/device/KINDS.md lists it: torch, numpy, pandas, pyarrow, fsspec, huggingface-hub, accelerate...);
# the versions this project's .venv runs.
pkgs=(fastcore==2.2.41 torcheval==0.0.7 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fastprogress==1.1.6
      python-fasthtml==0.14.14 starlette==1.10.0 uvicorn==0.54.0 oauthlib==4.0.1 itsdangerous==2.2.0 python-multipart==0.0.34
      beautifulsoup4==4.15.0 soupsieve==4.1.3 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
      # execnb and IPython, which bench/gpu_nb.py runs a notebook with (the image has no Jupyter)
      execnb==0.3.4 ipython==9.18.1 ipython_pygments_lexers==1.1.1 jedi==0.20.1 parso==0.8.7 matplotlib-inline==0.2.2
      pexpect==4.9.0 ptyprocess==0.7.0 prompt_toolkit==3.0.53 wcwidth==0.9.4 stack-data==0.6.3 asttokens==3.0.2
      executing==2.3.0 pure_eval==0.2.4 traitlets==5.16.1)
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || py=python3
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .gpu/whl "${pkgs[@]}"
du -sh .gpu/whl .gpu/fashion-mnist .gpu/fortunes
# the device tool carries at most 64 MiB in all (the working tree included): say so here, not on the GPU machine
kib=$(du -sk .gpu | cut -f1)
if [ "$kib" -gt $((56 * 1024)) ]; then echo "!!! .gpu is $((kib / 1024)) MiB: above 56 MiB, the run's carry (64 MiB with the checkout) may be refused"; exit 1; fi
echo ".gpu: $((kib / 1024)) MiB, within the carry limit; now one run: bash bench/gpu_run.sh with carry [\".gpu\"] (bench/README.md, 'On a GPU')"
