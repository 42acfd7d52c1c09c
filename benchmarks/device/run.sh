#!/usr/bin/env bash
# The benchmarks that need free cores, on the lent 16-core machine (`run` tool; carry [".whl"]):
#   bench_loadgen.py   the load generator against a plain tritonclient loop (target: >= 3x)
#   bench_gateway.py   what the gateway adds, latency and throughput (targets: <= 1 ms p50, >= 0.95); CPUS=E:G:C
#                      puts the engine, the gateways and the clients on cores of their own (0-7:8-11:12-15)
# .whl/site.tar.xz: a site-packages folder for that machine's Python 3.12 with what its image lacks
# (nvidia-pytriton's tritonserver, tritonclient, numpy 1.26 for the python backend stub, fastapi, uvicorn,
# httptools, pydantic, submitit); everything else (grpcio, httpx, aiohttp, uvloop, jinja2, pyyaml,
# tokenizers) is in the image; without that file (any machine with the project installed) nothing is added.
# Results: $OUT (default /tmp/device-bench). With .whl/base.tar (`git archive -o
# .whl/base.tar COMMIT`), that commit's gateway is one more latency side, measured against this one in the same run.
#   bench_relay.py     N simulated H200 replicas direct against through the gateway of 1, 2, 4 workers (target: >= 0.95),
#                      its CPU per relayed token (goal: <= 25 us); SLOWDOWN: model.sim.slowdown (the replicas' own
#                      serving path needs ~0.4 ms of CPU a token: at full pace 8 replicas need ~30 cores)
#   bench_routing.py   the routing policies on a multi-turn chat trace at a simulated H200's pace (2 and 4 replicas)
# Smallest: PARTS="loadgen gateway" REQUESTS=10 REPLICAS=1 ROUNDS=1 SECONDS_EACH=1 bash benchmarks/device/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO="$PWD"
export OUT="${OUT:-/tmp/device-bench}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
SITE=""  # the bundle's packages, unpacked fresh; none without it (an earlier run's must not shadow what is installed)
if [ -f .whl/site.tar.xz ]; then
    SITE=$(mktemp -d) && tar xJf .whl/site.tar.xz -C "$SITE"
fi
if [ -f .whl/head.tar ]; then  # a commit's tree (`git archive -o .whl/head.tar HEAD`), not a working tree mid-edit
    rm -rf /tmp/head && mkdir -p /tmp/head && tar xf .whl/head.tar -C /tmp/head && cd /tmp/head
fi
export PYTHONPATH="${SITE:+$SITE:}$PWD"
BASE=()
if [ -f "$REPO/.whl/base.tar" ]; then  # another commit's tree: its gateway is one more side
    rm -rf /tmp/base && mkdir -p /tmp/base && tar xf "$REPO/.whl/base.tar" -C /tmp/base
    BASE=(--baseline /tmp/base)
fi
echo "cores: $(nproc)  $(python3 -V)"
PARTS="${PARTS:-loadgen gateway}"
read -ra GW_WORKERS <<< "${WORKERS:-2 4}"
for part in $PARTS; do
    case "$part" in
        loadgen) python3 benchmarks/bench_loadgen.py --requests "${REQUESTS:-600}" --rounds 3 --replicas "${REPLICAS:-4}" --concurrency 64 2>&1 | tee "$OUT/loadgen.txt" ;;
        relay) python3 benchmarks/bench_relay.py --backend sim --replicas "${REPLICAS:-8}" --concurrency "${CONCURRENCY:-512}" \
                   --max-tokens "${MAX_TOKENS:-200}" --gateway-workers "${GW_WORKERS[@]}" --client-procs "${CLIENT_PROCS:-6}" \
                   --set "model.sim.slowdown=${SLOWDOWN:-8}" --rounds "${ROUNDS:-3}" --seconds "${SECONDS_EACH:-10}" \
                   ${CPUS:+--cpus "$CPUS"} "${BASE[@]}" 2>&1 | tee "$OUT/relay.txt" ;;
        routing) python3 benchmarks/bench_routing.py --backend sim --replicas "${ROUTING_REPLICAS:-2,4}" 2>&1 | tee "$OUT/routing.txt" ;;
        gateway) python3 benchmarks/bench_gateway.py --part overhead --auth none --requests "${REQUESTS:-300}" ${CPUS:+--cpus "$CPUS"} \
                     --rounds "${ROUNDS:-3}" --seconds "${SECONDS_EACH:-8}" "${BASE[@]}" 2>&1 | tee "$OUT/gateway.txt" ;;
    esac
done
