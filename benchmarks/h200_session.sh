#!/usr/bin/env bash
# One device call on the H200 (torch 2.11+cu130, triton 3.6, no package index): install the carried
# wheels (.whl/, from benchmarks/device_wheels.sh), build the torch211-cxx11-cu130 variant
# with the project's builder, stage it, then run the phases asked for, writing logs under $OUT.
#   bash benchmarks/h200_session.sh build test selftest        # correctness
#   bash benchmarks/h200_session.sh build check                # build-matrix's load-and-check, CUDA tensors too
#   bash benchmarks/h200_session.sh staged check test          # the carried build/ (say, a matrix built elsewhere)
#     (commit every tracked change before a `staged` call: test_builder.py::test_ops_id_comes_from_the_git_tree
#     compares the carried build's id with the copied tree, and a tree one edit away from the build's commit fails
#     it, as in the sixty-fifth session)
#     (a call carries at most 64 MiB: the tracked tree ~29 MB, .whl ~30 MB and a cu130 variant ~10 MB do not
#     fit together; for `test` leave Liger's and accelerate's wheels aside (the suite's counts at 538439c
#     were the same without them), for `bench` transformers' and accelerate's (it imports neither); at 9991c33
#     the tree had grown to 29.3 MB and `staged` + `test` needed nvidia-cutlass' wheel aside too (no build there))
#   bash benchmarks/h200_session.sh build bench                # the side-by-side harness
#   bash benchmarks/h200_session.sh tune build diag test bench # + decode configs, cuBLASLt facts
#   bash benchmarks/h200_session.sh build host decode          # host time per call; decode graph variants
#   bash benchmarks/h200_session.sh build sweep                # decode_sweep.py (SWEEP_ARGS)
#   bash benchmarks/h200_session.sh build probe                # kernel_probe.py (PROBE_SECTIONS, default decode)
#   bash benchmarks/h200_session.sh build seqfirst             # seqfirst_route.py (SEQFIRST_ARGS)
#   bash benchmarks/h200_session.sh build ltpick               # lt_pick.py, the cuBLASLt pick (LTPICK_ARGS)
#   bash benchmarks/h200_session.sh build bench pack           # ... and every log/result in one results.tgz
#   TEST_FILES=ops bash benchmarks/h200_session.sh build test    # the whole suite in two calls: ops, then
#   TEST_FILES=loader bash benchmarks/h200_session.sh build test noarch  # the rest + the noarch route
#   TEST_FILES=tests bash benchmarks/h200_session.sh build test noarch  # ... or all of it in one call: on a
#   fresh H100 at d3c3b41, -n 15, the suite took 176 s and noarch 102 s, 316 s with the build
# The last lines printed are a short summary of each phase.
# Build time: `build` leaves $OUT/objcache-cu.tgz (the builder's compiled kernel objects, keyed by
# their sources, flags and torch version). Unpacked into .objcache-cu/ here (in .gitignore) and carried
# with the next call (carry [".whl", ".objcache-cu"]), it lets the builder skip every kernel source that
# did not change; the binding is always recompiled.
# Provenance: export FUSED_GEGLU_COMMIT=<the full 40-hex commit> (a short id is refused). The copy's own
# .git may hold an older HEAD, so the builder cannot check the tree against that commit and records it
# dirty; where the copied tree is exactly that commit (files of the call itself moved out first),
# FUSED_GEGLU_DIRTY=0 says so.
# CARD=H200 runs nothing (exit 3) on a card whose name lacks it: a call for the H200 may get an H100, and
# the wheels and the build would spend device time first. A carried .commit (`git rev-parse HEAD > .commit`
# here, before the call) gives FUSED_GEGLU_COMMIT where it is not set; FUSED_GEGLU_DIRTY=0 stays the caller's word.
# The summary is also written to $OUT/summary.txt once every phase has run (after `pack`, so it comes back).
set -uo pipefail
OUT=${OUT:-/tmp/fg-out}
mkdir -p "$OUT"
if [ -n "${CARD:-}" ]; then
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ "$card" == *"$CARD"* ]] || { echo "card '${card:-none}' is not $CARD: nothing run"; exit 3; }
fi
if [ -z "${FUSED_GEGLU_COMMIT:-}" ] && [ -f .commit ]; then export FUSED_GEGLU_COMMIT=$(cat .commit); fi
export PYTHONUNBUFFERED=1 FUSED_GEGLU_CUDA_ARCHS=${FUSED_GEGLU_CUDA_ARCHS:-9.0}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src
FG="python3 -m fused_geglu_tools"
# pytest-xdist workers for the test phases, one per core but one. Unset, the
# phases used to run serially (one call in the fifty-eighth session: 540 s for the ops files less
# the FSDP ones). PYTEST_ARGS="" runs serially; tests/conftest.py gives each worker its share of the cores.
if [ -z "${PYTEST_ARGS+set}" ] && python3 -c "import xdist" 2>/dev/null; then
  PYTEST_ARGS="-n $(( $(nproc) > 2 ? $(nproc) - 1 : 1 )) --tb=short"
fi
# The op-facing test files (the heavy half of the suite: `TEST_FILES=ops`), and the kernel-facing ones the
# `noarch` phase runs (the Makefile's NOARCH_TESTS, with the Triton launcher's and the policy's).
OPS_TESTS=$(printf 'tests/test_%s.py ' eager_entries autograd_contract mlp linear geglu training_nodes compile policy \
  triton_launch fsdp tensor_parallel)
NOARCH_TESTS=$(printf 'tests/test_%s.py ' triton_launch geglu linear mlp layers loading transformers_integration \
  training_nodes autograd_contract compile eager_entries fsdp tensor_parallel policy)
summary=()
t0=$(date +%s)
for phase in "$@"; do
  start=$(date +%s)
  case $phase in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
      # Objects of unchanged kernel sources from an earlier call (see the header) skip their compile.
      # They move into build/ before the build: where the copy's .git does not know the commit, the
      # builder names the tree by its files, and the tree the tests see must be the tree it named.
      if [ -d .objcache-cu ]; then mkdir -p build/.objcache && cp -n .objcache-cu/*.o build/.objcache/ 2>/dev/null; rm -rf .objcache-cu; fi
      # Where the copy's .git has the commit, the builder names the tree by git: the call's own carried
      # files must not make it dirty: .whl, .commit and .objcache-cu are in .gitignore (the copy's, which is
      # this tree's), a caller's devcall* scripts are excluded here.
      if [ -d .git ]; then
        mkdir -p .git/info && printf '%s\n' '/devcall*' >> .git/info/exclude
        git status --porcelain --untracked-files=all 2>/dev/null | head -20 > "$OUT/git-status.txt"
      fi
      $FG build --backends cuda 2>&1 | tee "$OUT/build.log"; rc=${PIPESTATUS[0]}
      tar czf "$OUT/objcache-cu.tgz" -C build/.objcache . 2>/dev/null
      $FG stage >> "$OUT/build.log" 2>&1
      ls -la build/*/ >> "$OUT/build.log"
      so=$(ls build/torch211-*/*.so 2>/dev/null | head -1)
      [ -n "$so" ] && cuobjdump --dump-sass "$so" 2>/dev/null | grep -oE "(HGMMA|UTMALDG|UTMASTG)\.[0-9A-Za-z_.x]+" | sort | uniq -c | sort -rn > "$OUT/sass_hgmma.txt"
      tar czf "$OUT/build-cu.tgz" build/torch211-* build/torch-cuda 2>/dev/null
      summary+=("build rc=$rc $(($(date +%s)-start))s so=$(du -h ${so:-/dev/null} | cut -f1) hgmma_lines=$(wc -l < "$OUT/sass_hgmma.txt" 2>/dev/null) cached_objects=$(grep -c '(cached)' "$OUT/build.log")")
      ;;
    staged)
      # Instead of `build`: stage the build/ the call carried, as it is (carry ["build/torch211-...", "build/torch-cuda"]),
      # e.g. the variants `fused-geglu build-matrix` made on a machine with no GPU, which is what gets published.
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
      ls -d build/torch* > "$OUT/staged.log" 2>&1 && sha256sum build/torch*/*.so >> "$OUT/staged.log" 2>&1
      grep -h -A2 '"kernel"' build/torch*/metadata.json >> "$OUT/staged.log" 2>&1
      $FG stage >> "$OUT/staged.log" 2>&1; rc=$?
      summary+=("staged rc=$rc $(ls -d build/torch* 2>/dev/null | xargs -n1 basename | tr '\n' ' ')$(($(date +%s)-start))s")
      ;;
    tune)
      # Decode-size (M = 16) Triton configs for the MLP's gate+up and down GEMMs of the benchmark
      # shapes, timed as CUDA-graph replays; winners merged into configs_sm90.json (before `build`).
      tj=torch-ext/fused_geglu/triton_kernels
      python3 $tj/tune.py --kernel gateup_fwd --shape 16,6912,1152 --shape 16,16384,2048 --shape 16,14336,3584 \
        --shape 16,3072,768 --write > "$OUT/tune.log" 2>&1
      python3 $tj/tune.py --kernel linear_fwd --shape 16,1152,6912 --shape 16,2048,16384 --shape 16,3584,14336 \
        --shape 16,768,3072 --write >> "$OUT/tune.log" 2>&1
      cp $tj/configs_sm90.json "$OUT/"
      grep '^best' "$OUT/tune.log"
      summary+=("tune $(grep -c '^best' "$OUT/tune.log") shapes $(($(date +%s)-start))s")
      ;;
    diag)
      # Facts for the cuBLASLt crash: which C++ runtime the .so binds, and a native backtrace of one call.
      so=$(ls build/torch211-*/*.so | head -1)
      { g++ --version | head -1; nvcc --version | tail -1; ldd "$so";
        echo "== defined C++ runtime symbols in the .so"; nm -DC --defined-only "$so" | grep -E "std::(basic_ostream|locale|ios_base|__cxx11::basic_ostringstream)|_M_insert" | head -20;
        echo "== libstdc++ mapped after import torch"; python3 -c "import torch; print(open('/proc/self/maps').read())" | grep -E "stdc\+\+" | awk '{print $6}' | sort -u;
      } > "$OUT/diag.log" 2>&1
      gcc -shared -fPIC -O1 -o /tmp/segv_trace.so benchmarks/diag/segv_trace.c
      HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache LD_PRELOAD=/tmp/segv_trace.so timeout 60 python3 benchmarks/diag/lt_probe.py >> "$OUT/diag.log" 2>&1
      echo "lt_probe exit $?" >> "$OUT/diag.log"
      tail -5 "$OUT/diag.log"
      summary+=("diag $(tail -1 "$OUT/diag.log")")
      ;;
    test)
      # TEST_FILES: paths, or `ops` / `loader`, the two halves of the whole suite (on an H100, -n 15: ops
      # 414 s and loader 126 s at 024e001, when every worker ran torch's 16 threads; 147 s and 83 s at
      # 4f36870, with tests/conftest.py's share of the cores and errors() reduced on the GPU).
      case ${TEST_FILES:-tests} in
        ops) files=$OPS_TESTS ;;
        loader) files=$(for f in tests/test_*.py; do [[ " $OPS_TESTS " == *" $f "* ]] || printf '%s ' "$f"; done) ;;
        *) files=${TEST_FILES:-tests} ;;
      esac
      timeout ${TEST_TIMEOUT:-330} python3 -m pytest $files -p no:cacheprovider -o addopts="" -rfE -v --tb=line --durations=15 --maxfail=40 ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/test.log" | tail -40
      summary+=("test $(grep -c ' PASSED' "$OUT/test.log") passed, $(grep -c ' FAILED' "$OUT/test.log") failed, $(grep -c ' SKIPPED' "$OUT/test.log") skipped; $(tail -1 "$OUT/test.log" | cut -c1-200) $(($(date +%s)-start))s")
      ;;
    noarch)
      # The kernel-facing files over the Triton-only torch-cuda variant that `build` wrote from the same
      # tree, staged alone: the route of a CUDA torch with no compiled build (and the tests that need a
      # tree without the compiled library). Run after `build`.
      $FG stage --variants torch-cuda --cache "$PWD/.hub-cache-noarch" > "$OUT/stage-noarch.log" 2>&1
      FUSED_GEGLU_TEST_NOARCH=1 FUSED_GEGLU_TEST_CACHE="$PWD/.hub-cache-noarch" timeout ${TEST_TIMEOUT:-330} \
        python3 -m pytest $NOARCH_TESTS -p no:cacheprovider -o addopts="" -rfE -v --tb=short --maxfail=40 ${PYTEST_ARGS:-} \
        > "$OUT/test-noarch.log" 2>&1
      tail -1 "$OUT/test-noarch.log"
      summary+=("noarch $(grep -c ' PASSED' "$OUT/test-noarch.log") passed, $(grep -c ' FAILED' "$OUT/test-noarch.log") failed; $(tail -1 "$OUT/test-noarch.log" | cut -c1-200) $(($(date +%s)-start))s")
      ;;
    check)
      # What `fused-geglu build-matrix` runs per member (fused_geglu_tools/variant_check.py): the staged
      # snapshot loaded through kernels for each backend, its ops against float64, on CUDA tensors too here.
      read -r repo_id version < <(python3 -c 'from fused_geglu_tools.buildconfig import hub_repo_id, hub_version
print(hub_repo_id(), hub_version())')
      for b in cuda cpu; do
        # Only the backends build/ holds (this script builds --backends cuda): torch-cuda / torch211-*-cu130.
        ls -d build/torch*-${b/cuda/cu}* > /dev/null 2>&1 || { echo '{"skipped": "not built here"}' > "$OUT/variant-check-$b.json"; continue; }
        HF_HUB_OFFLINE=1 HF_HUB_CACHE="$PWD/.hub-cache" timeout 300 python3 -m fused_geglu_tools.variant_check \
          --repo-id "$repo_id" --version "$version" --backend $b > "$OUT/variant-check-$b.out" 2> "$OUT/variant-check-$b.log"
        tail -1 "$OUT/variant-check-$b.out" > "$OUT/variant-check-$b.json"
      done
      line=$(python3 - "$OUT"/variant-check-{cuda,cpu}.json <<'PY' 2>&1
import json, sys
for path in sys.argv[1:]:
    try:
        r = json.load(open(path))
    except ValueError:
        print(f"{path}: no result;", end=" ")
        continue
    checks = [f"{c['op']}/{c['device']}/{c['dtype']} {c['error']:.1e}<={c['allowed']:.1e} {c['backend']}"
              + ("" if c["ok"] else " FAIL") for c in r.get("checks", [])]
    print(r.get("variant") or r.get("error") or r.get("skipped"), *checks, end="; ")
PY
)
      summary+=("check $line $(($(date +%s)-start))s")
      ;;
    selftest)
      # One process per check group: a crash in one op must not hide the others' results.
      : > "$OUT/selftest.log"
      for t in ${SELFTEST_GROUPS:-test_geglu_gateup test_linear test_linear_bwd test_graph_capture bench}; do
        timeout 120 python3 - "$t" <<'PY' >> "$OUT/selftest.log" 2>&1
import os, sys, importlib.util, torch
os.environ["HF_HUB_OFFLINE"] = "1"; os.environ["HF_HUB_CACHE"] = os.path.abspath(".hub-cache")
import kernels, tomllib
general = tomllib.loads(open("build.toml").read())["general"]
k = kernels.get_kernel(general["hub"]["repo-id"], version=general["version"], trust_remote_code=True)
spec = importlib.util.spec_from_file_location("selftest", "kernel_src/gemm_sm90/selftest.py")
st = importlib.util.module_from_spec(spec); spec.loader.exec_module(st)
name = sys.argv[1]
print(f"== {name}", flush=True)
torch.manual_seed(0); torch.backends.cuda.matmul.allow_tf32 = False
getattr(st, name)(getattr(torch.ops, k.OPS_ID), torch.device("cuda"))
bad = [r for r in st._results if r[1] != "ok"]
print(f"{name}: {len(st._results) - len(bad)}/{len(st._results)} ok", *[f"\n  FAIL {r[0]}: {r[2]}" for r in bad], flush=True)
PY
        echo "$t exit $?" >> "$OUT/selftest.log"
      done
      tail -80 "$OUT/selftest.log"
      summary+=("selftest $(grep -E ' exit [0-9]+$| ok$' "$OUT/selftest.log" | tr '\n' ';') $(($(date +%s)-start))s")
      ;;
    bench)
      timeout ${BENCH_TIMEOUT:-500} python3 benchmarks/compare.py --out "$OUT" --budget-s ${BENCH_BUDGET:-420} ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -60
      summary+=("bench $(($(date +%s)-start))s")
      ;;
    host)
      # Host time per MLP call, piece by piece, and ours with each forward path forced (no-graph decode rule).
      export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
      mkdir -p "$OUT/host"
      for s in gemma3-1b gemma-2b gemma2-9b; do
        timeout 150 python3 benchmarks/diag/host_time.py --shape $s --tokens ${HOST_TOKENS:-1,16,1024} --parts --forced \
          --out "$OUT/host" 2>&1 | grep -v -i warn | tee -a "$OUT/host.log"
      done
      summary+=("host $(ls "$OUT"/host/*.json 2>/dev/null | wc -l) shapes $(($(date +%s)-start))s")
      ;;
    decode)
      # The decode graph's launch and tile variants, interleaved rounds (decode_pdl.py --help).
      export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
      timeout 200 python3 benchmarks/diag/decode_pdl.py --out "$OUT" --rounds 7 ${DECODE_ARGS:-} 2>&1 | tail -25 | tee "$OUT/decode.log"
      summary+=("decode $(($(date +%s)-start))s")
      ;;
    sweep)
      # Decode launch configs of the Triton gate+up and down kernels, timed cold (decode_sweep.py --help).
      export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
      timeout ${SWEEP_TIMEOUT:-420} python3 benchmarks/diag/decode_sweep.py --out "$OUT" ${SWEEP_ARGS:-} 2>&1 \
        | grep -v -i warn | tee "$OUT/sweep.log" | tail -40
      summary+=("sweep $(($(date +%s)-start))s")
      ;;
    probe)
      # Per-kernel timings for the dispatch policy (kernel_probe.py; default: the decode tiles).
      export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
      mkdir -p "$OUT/probe"
      timeout ${PROBE_TIMEOUT:-200} python3 benchmarks/diag/kernel_probe.py --out "$OUT/probe" \
        --sections ${PROBE_SECTIONS:-decode} ${PROBE_ARGS:-} 2>&1 | tee "$OUT/probe.log" | tail -60
      summary+=("probe ${PROBE_SECTIONS:-decode} $(($(date +%s)-start))s")
      ;;
    seqfirst)
      # linear over a sequence-first x: batched cuBLASLt against the routes that copy x to rows first
      # (seqfirst_route.py --help); SEQFIRST_ARGS picks shapes, BxS pairs, activations.
      export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
      timeout ${SEQFIRST_TIMEOUT:-400} python3 benchmarks/diag/seqfirst_route.py --out "$OUT" ${SEQFIRST_ARGS:-} 2>&1 \
        | grep -v -i warn | tee "$OUT/seqfirst.log" | tail -70
      summary+=("seqfirst $(grep -c '|' "$OUT/seqfirst.log") cases $(($(date +%s)-start))s")
      ;;
    ltpick)
      # The cuBLASLt linear's candidate pick (benchmarks/diag/lt_pick.py --help): one process with the
      # heuristic's first only, one that times the first 4 (logging each pick), then the comparison.
      # LTPICK_ARGS picks shapes, tokens, activations, --wgrad.
      export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
      FUSED_GEGLU_LT_CANDIDATES=1 timeout ${LTPICK_TIMEOUT:-200} python3 benchmarks/diag/lt_pick.py --out "$OUT" \
        --tag first ${LTPICK_ARGS:-} > "$OUT/ltpick-first.log" 2>&1
      FUSED_GEGLU_LT_CANDIDATES=4 FUSED_GEGLU_LT_LOG=1 timeout ${LTPICK_TIMEOUT:-200} python3 benchmarks/diag/lt_pick.py --out "$OUT" \
        --tag timed ${LTPICK_ARGS:-} > "$OUT/ltpick-timed.log" 2>&1
      python3 benchmarks/diag/lt_pick.py --compare "$OUT/lt-pick-first.json" "$OUT/lt-pick-timed.json" 2>&1 \
        | tee "$OUT/ltpick.log" | tail -${LTPICK_TAIL:-80}
      summary+=("ltpick $(grep -c '/M[0-9]' "$OUT/ltpick.log") cases, picks logged $(grep -c 'pick:' "$OUT/ltpick-timed.log") $(($(date +%s)-start))s")
      ;;
    e2e)
      # E2E_ARGS, e.g. "--batch 1 --seq 16 --reps 40 --rounds 4 --no-compile --host-profile" (decode host time)
      export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
      timeout ${E2E_TIMEOUT:-200} python3 benchmarks/e2e_gemma.py --out "$OUT" ${E2E_ARGS:-} 2>&1 | tee "$OUT/e2e.log" | tail -30
      summary+=("e2e $(($(date +%s)-start))s")
      ;;
    pack)
      # The device tool brings back at most 8 files from $OUT: a bench phase alone leaves a .json, .png and
      # .log beside the build's, and the .json is what a result needs. Put everything written so far,
      # except the two build archives, into one results.tgz (last, after the phases that write). It moves
      # the files: a log the caller is still writing under $OUT goes in cut short, so write it elsewhere.
      (cd "$OUT" && find . -type f ! -name objcache-cu.tgz ! -name build-cu.tgz ! -name results.tgz -print0 \
        | tar czf results.tgz --null -T - --remove-files) && find "$OUT" -mindepth 1 -type d -empty -delete
      summary+=("pack $(tar tzf "$OUT/results.tgz" | wc -l) files in results.tgz")
      ;;
    *) echo "unknown phase $phase"; exit 2;;
  esac
done
{ echo "== summary ($(($(date +%s)-t0)) s)"; printf '%s\n' "${summary[@]}"; } | tee "$OUT/summary.txt"
