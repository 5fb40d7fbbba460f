# The one set-up of the offline GPU machine, sourced by every benchmarks/*_gpu.sh (official, mesh,
# big_captures, suite): the carried wheels installed to /tmp/site, this checkout's sources first on the path,
# the CUDA extension's cache unpacked from .devdata/ext.tgz (and, for mesh and big_captures, built once as a
# step of its own); time-boxed steps that all end by one deadline, so a whole call fits its slot.
#
#   DEADLINE_S   seconds after the script's start by which every step has ended (default 525: a call of
#                9 minutes, with room for the summary)
#   WHEELS       folders of wheels to install (space-separated; default .whl, the Hydra wheels of
#                ../shared/device-wheels; empty: none, as on a machine that has the packages)
#   PYTHON       the interpreter (default python3)
#   SKIP_EXT=1   no extension step (the CPU tries of these scripts)
#   STEPS_TSV    where step records go (name, exit status, seconds; default $OUT/steps.tsv)
#
# step NAME LIMIT NEED CMD...: CMD under `timeout` of LIMIT seconds, clipped to the time left before the
# deadline; skipped (status 125, "skipped" in the record) when less than NEED seconds are left. SIGTERM
# first, SIGKILL 10 s later (Lightning traps SIGTERM and writes its checkpoint).

PY=${PYTHON:-python3}
DEADLINE_S=${DEADLINE_S:-525}
T0=${T0:-$(date +%s)}
export T0

elapsed() { echo $(($(date +%s) - T0)); }

gpu_setup() {  # the wheels, then the extension
    gpu_wheels && gpu_extension
}

gpu_wheels() {  # install the carried wheels, this checkout first on the path, the extension cache
    local whls=() d w
    for d in ${WHEELS-.whl}; do
        for w in "$d"/*.whl; do [ -f "$w" ] && whls+=("$w"); done
    done
    if ((${#whls[@]})); then
        timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "${whls[@]}" || { echo "gpu_setup: installing the wheels failed" >&2; return 1; }
        export PYTHONPATH="/tmp/site:$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    else
        export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
    export PYTHONUNBUFFERED=1
    if [ -f .devdata/ext.tgz ] && [ ! -d "$TORCH_EXTENSIONS_DIR" ]; then
        mkdir -p "$TORCH_EXTENSIONS_DIR" && tar -xzf .devdata/ext.tgz -C "$TORCH_EXTENSIONS_DIR"
    fi
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader 2>/dev/null || true
}

gpu_extension() {  # built once here, so no timed run pays for it
    if [ "${SKIP_EXT:-0}" != 1 ]; then
        step extension 180 60 "$PY" -m nerf_lightning.ops._ext || echo "gpu_setup: no CUDA extension" >&2
    fi
    return 0
}

step() {
    local name=$1 limit=$2 need=$3
    shift 3
    local left=$((DEADLINE_S - $(elapsed)))
    local record=${STEPS_TSV:-${OUT:-.}/steps.tsv}
    if ((left < need)); then
        echo "== $name skipped: ${left}s left before the deadline, it needs ${need}s" >&2
        printf '%s\tskipped\t0\n' "$name" >>"$record"
        return 125
    fi
    ((limit > left)) && limit=$left
    echo "== $name (timeout ${limit}s, at $(elapsed)s of ${DEADLINE_S}s)" >&2
    local t rc=0
    t=$(date +%s)
    timeout --signal=TERM --kill-after=10 "$limit" "$@" || rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t))" >>"$record"
    return $rc
}
