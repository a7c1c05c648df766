#!/usr/bin/env bash
# Everything issue 30 owes a GPU, in one call that cannot lose its results: at most 450 s in
# all (SN_CHECK_SECONDS), each stage cut with SIGINT at its share (so pytest still writes its
# summary and XML) and each writing its JSON as it goes, so a cut keeps what had finished.
# Stages, by value: the GPU tests, the gradient diagnosis, the speed benchmark, the measured
# optimal table (ResNet-50 only), sn-depth --verify. At most 6 files under $OUT (the device
# call returns 8):
#
#   log.txt               nvidia-smi, versions, every stage's output, exit status and time
#   gpu_tests.xml         pytest -m gpu over the GPU test files only (one import error in
#                         another file cannot stop them at collection), a 90 s deadline a test
#   grad_diag.json        tools/grad_diag.py: ResNet-18's parameter errors against float64,
#                         three ways (as is, deterministic engines, no FFT/Winograd)
#   bench_gpu.json        tools/bench_gpu.py: the host link (GB/s each way, and both at once),
#                         ResNet-50 at batch 64 against PyTorch (fp32),
#                         liveness also with --cuda-graph (liveness+cuda_graph), with the GPU
#                         tests' counts in it (gpu_tests)
#   optimal_measured.json tools/optimal_table.py --nets resnet50 --measured
#   depth_verify.json     sn-depth --memory 12GiB --batch 16 --verify --device gpu --json
#
# Prepare here, once (the cuDNN Frontend's wheel, pinned, for the device's Python 3.12):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#       nvidia-cudnn-frontend==1.32.0
# then: device run, command "bash tools/gpu_check.sh", carry [".whl"], timeout_s 540.
#
# SN_CHECK_DRY_RUN=1 skips the installs and nvidia-smi and runs the stages with
# SN_CHECK_PYTHON (a stub): tests/test_gpu_check.py checks the cuts and the files so.
set -u
OUT=${OUT:-/tmp/sn-gpu-check}
TOTAL=${SN_CHECK_SECONDS:-450}
PY=${SN_CHECK_PYTHON:-python3}
DRY=${SN_CHECK_DRY_RUN:-0}
FRONTEND_VERSION=1.32.0
START=$SECONDS
LOG="$OUT/log.txt"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
: > "$LOG"

say() { echo "$*" | tee -a "$LOG"; }

# stage NAME PERCENT CMD...: run CMD with PERCENT of the whole time at most (less when the
# whole is nearly spent), SIGINT at the limit, SIGKILL 10 s after that.
stage() {
    local name=$1 budget=$(( TOTAL * $2 / 100 )); shift 2
    local left=$(( TOTAL - (SECONDS - START) - 2 ))
    (( budget > left )) && budget=$left
    if (( budget < 1 )); then say "== $name: skipped, no time left"; return; fi
    say "== $name (at most $budget s): $*"
    local t0=$SECONDS
    timeout -s INT -k 10 "$budget" "$@" >> "$LOG" 2>&1
    local rc=$?
    local cut=""
    (( rc == 124 )) && cut=", cut at its limit"
    say "== $name: exit $rc after $(( SECONDS - t0 )) s$cut"
}

if [ "$DRY" != 1 ]; then
    wheel=$(ls .whl/nvidia_cudnn_frontend-${FRONTEND_VERSION}-*.whl 2>/dev/null | head -1)
    if [ -n "$wheel" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "$wheel" >> "$LOG" 2>&1 && export PYTHONPATH=/tmp/site
    else
        say "no .whl/nvidia_cudnn_frontend-${FRONTEND_VERSION}-*.whl: cuDNN's engines unused (im2col fallback)"
    fi
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >> "$LOG" 2>&1 \
        || say "pip install -e . failed: running from the checkout"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    {
        nvidia-smi
        python3 -c "import sys, cupy; print(sys.version); print('cupy', cupy.__version__)"
        python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, 'backend', cudnn.backend_version())"
        python3 -c "import cupy.cuda.nccl as n; print('nccl available', n.available)"
    } >> "$LOG" 2>&1
fi

GPU_TESTS=$(grep -l "pytest.mark.gpu" tests/test_*.py | tr '\n' ' ')
# the deadline plugin by its own name from tools/ (a package called "tools" installed on the
# machine would shadow this folder's)
stage "GPU tests" 38 env PYTHONPATH="$PWD/tools${PYTHONPATH:+:$PYTHONPATH}" \
    $PY -m pytest -q -m gpu -p no:cacheprovider -p pytest_deadline --deadline 90 \
    -rfE --tb=short --durations=15 --junitxml="$OUT/gpu_tests.xml" $GPU_TESTS
stage "gradient diagnosis" 13 $PY tools/grad_diag.py --json "$OUT/grad_diag.json"
stage "speed benchmark" 22 $PY tools/bench_gpu.py --nets resnet50 --batch 64 \
    --policies liveness,superneurons@0.33,optimal@0.33 --cuda-graph liveness --iters 10 --warmup 3 \
    --gpu-tests-xml "$OUT/gpu_tests.xml" --json "$OUT/bench_gpu.json"
stage "measured optimal table" 13 $PY tools/optimal_table.py --nets resnet50 --measured --solver-time 10 \
    --json "$OUT/optimal_measured.json"
# nvidia-smi's figure beside the planned and the arena's peaks: its largest reading meanwhile
if [ "$DRY" != 1 ]; then
    (while sleep 0.5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done) > /tmp/sn-smi.txt 2>&1 &
    SMI=$!
fi
stage "sn-depth --verify" 100 sh -c "$PY -m superneuron.cli.depth --memory 12GiB --batch 16 --verify \
    --device gpu --json > '$OUT/depth_verify.json'"
if [ "$DRY" != 1 ]; then
    kill "$SMI" 2>/dev/null
    say "nvidia-smi's largest memory.used during sn-depth --verify: $(sort -n /tmp/sn-smi.txt | tail -1) MiB"
fi
say "== done in $(( SECONDS - START )) s; files: $(ls "$OUT" | tr '\n' ' ')"
