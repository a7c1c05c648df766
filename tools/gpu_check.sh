#!/usr/bin/env bash
# The checks the open issues owe a GPU, in one call of about 9 minutes (an H100 or H200 with
# CuPy, cuDNN 9 and PyTorch installed and no network), every result written under $OUT:
#
#   gpu.txt               nvidia-smi, the Python, CuPy and cuDNN Frontend versions
#   gpu_tests.txt/.xml    pytest -m gpu: every GPU test, those written and never run included
#                         (fused ReLU kernels, a convolution's gradient over its input, ReLU's
#                         sign bits written by its forward and read by its backward, max
#                         pooling's one-kernel forward and argmax, LRN, BatchNorm and Pooling
#                         chunked, policies against baseline, gist among them)
#   optimal_measured.*    tools/optimal_table.py on ResNet-50 and GoogLeNet with their kernels
#                         timed on this GPU (cuDNN's engines where the frontend is installed):
#                         optimal against liveness at 2/3 .. 1/4 of liveness's arena
#   bench_gpu.*           tools/bench_gpu.py: ResNet-50 against PyTorch, images per second
#
# Prepare here (once; the frontend's wheel for the device's Python 3.12):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl nvidia-cudnn-frontend
# then run it with the device tool: command "bash tools/gpu_check.sh", carry [".whl"], timeout_s 570.
set -u
OUT=${OUT:-/tmp/sn-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.txt" 2>&1 || { cat "$OUT/install.txt"; exit 1; }
{
    nvidia-smi
    python3 -c "import sys, cupy; print(sys.version); print('cupy', cupy.__version__)"
    python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())" 2>&1
} > "$OUT/gpu.txt" 2>&1
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" tests \
    > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
timeout 200 python3 tools/optimal_table.py --nets resnet50,googlenet --measured --solver-time 10 \
    --json "$OUT/optimal_measured.json" > "$OUT/optimal_measured.txt" 2>&1
tail -20 "$OUT/optimal_measured.txt"
timeout 100 python3 tools/bench_gpu.py --nets resnet50 --policies liveness,superneurons --iters 10 --warmup 3 \
    --json "$OUT/bench_gpu.json" > "$OUT/bench_gpu.txt" 2>&1
tail -8 "$OUT/bench_gpu.txt"
