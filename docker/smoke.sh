#!/usr/bin/env bash
# Smoke test of the image: builds the CPU variant of docker/Dockerfile, then runs what a user
# runs and checks what they would see: a tiny training run and its resume, `docker stop`
# (SIGTERM) saving a checkpoint, the metrics endpoint, Jupyter behind its token, ssh with a key
# (and only a key) running `trainformer --version` and `trainformer doctor` with every pinned
# version checked, TensorBoard, and the compose files with the CPU override.
#
# Run it by hand when docker/ changes, and record its summary in docs/measured.md. It is NOT
# run in CI: it takes ~10 minutes from cold on 2 cores (the build downloads and installs ~3 GB;
# 2 minutes with the image cached) and needs a container engine. The GPU variant is not built
# (running it needs a GPU and NVIDIA's runtime).
#
#   docker/smoke.sh                       # from anywhere in the checkout
#
# Settings (environment):
#   ENGINE      docker or podman (default: docker when its daemon answers, else podman)
#   IMAGE       the tag built and tested (default trainformer:smoke-cpu)
#   PULL        never | missing | always: the build's base-image policy (default: the engine's).
#               `never` builds from local base images only, for machines without a registry.
#   BUILD_OPTS  more build options, split on spaces (e.g. podman's `-v DIR:/etc/xdg/pip:ro` to
#               give pip a pip.conf)
#   SKIP_BUILD  1: test IMAGE as it is
#   LOGS        folder for one log per check (default: a new temporary folder, kept)
#   PORT_BASE   host ports used on 127.0.0.1: PORT_BASE+22 (ssh), +88 (Jupyter), +60 (TensorBoard),
#               +94 (metrics), +89 (Jupyter, generated token) (default 18000)
#
# Prints one PASS/FAIL/SKIP line per check; exits with the number of failed checks. Removes its
# containers and its volume at the end, and keeps the image (`$ENGINE rmi $IMAGE` removes it).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${IMAGE:-trainformer:smoke-cpu}"
LOGS="${LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/trainformer-smoke.XXXXXX")}"
PORT_BASE="${PORT_BASE:-18000}"
SSH_HOST_PORT=$((PORT_BASE + 22)) JUPYTER_HOST_PORT=$((PORT_BASE + 88)) JUPYTER2_HOST_PORT=$((PORT_BASE + 89))
TB_HOST_PORT=$((PORT_BASE + 60)) METRICS_HOST_PORT=$((PORT_BASE + 94))
NAME=trainformer-smoke  # containers: $NAME-*, volume: $NAME-runs
VOLUME=$NAME-runs
mkdir -p "$LOGS"

if [[ -z "${ENGINE:-}" ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
    elif command -v podman >/dev/null; then ENGINE=podman
    else echo "smoke: neither a docker daemon nor podman found (set ENGINE)" >&2; exit 2
    fi
fi
for tool in curl ssh ssh-keygen; do
    command -v "$tool" >/dev/null || { echo "smoke: $tool is needed on this machine" >&2; exit 2; }
done

T0=$(date +%s)
PASSED=0 FAILED=0 SKIPPED=0
say() { printf '[%4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
pass() { PASSED=$((PASSED + 1)); say "PASS $*"; }
fail() { FAILED=$((FAILED + 1)); say "FAIL $*"; }
skip() { SKIPPED=$((SKIPPED + 1)); say "SKIP $*"; }
verdict() {  # verdict NAME DETAIL TEST...: PASS or FAIL by TEST's exit status
    local name=$1 detail=$2; shift 2
    if "$@"; then pass "$name: $detail"; else fail "$name: $detail (log: $LOGS/$name.log)"; fi
}
wait_for() {  # wait_for SECONDS CMD...: until CMD succeeds
    local end=$(($(date +%s) + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [[ $(date +%s) -lt $end ]] || return 1
        sleep 2
    done
}
http() { curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$@"; }
engine() { "$ENGINE" "$@"; }
cleanup() {
    local c
    for c in sigterm jupyter jupyter2 ssh tensorboard; do engine rm -f "$NAME-$c" >/dev/null 2>&1; done
    engine volume rm -f "$VOLUME" >/dev/null 2>&1
}
trap cleanup EXIT
cleanup
say "engine: $ENGINE ($(engine --version 2>&1 | head -1)), image $IMAGE, logs in $LOGS"

# --- build ---------------------------------------------------------------------------------------
if [[ "${SKIP_BUILD:-}" != 1 ]]; then
    build=(build --build-arg VARIANT=cpu -f docker/Dockerfile -t "$IMAGE")
    if [[ "$ENGINE" == podman ]]; then
        build+=(--format docker)  # SHELL (pipefail) is a Docker-format instruction: OCI drops it
        [[ -z "${PULL:-}" ]] || build+=("--pull=$PULL")
    elif [[ "${PULL:-}" == always ]]; then
        build+=(--pull)  # docker build pulls only when asked; never/missing are its default
    fi
    # shellcheck disable=SC2206  # BUILD_OPTS is a list of words
    build+=(${BUILD_OPTS:-})
    s=$(date +%s)
    (cd "$ROOT" && engine "${build[@]}" .) >"$LOGS/build.log" 2>&1
    rc=$?
    verdict build "rc=$rc in $(($(date +%s) - s))s" test $rc = 0
    [[ $rc = 0 ]] || { tail -30 "$LOGS/build.log"; exit 1; }
fi
size=$(engine image inspect "$IMAGE" --format '{{.Size}}' 2>/dev/null) || { fail "image: $IMAGE not found"; exit 1; }
say "image: $((size / 1000000)) MB, $(engine image inspect "$IMAGE" --format 'user {{.Config.User}}, entrypoint {{.Config.Entrypoint}}')"

# --- verbs that return at once -------------------------------------------------------------------
engine run --rm "$IMAGE" --version >"$LOGS/version.log" 2>&1
verdict version "$(tail -1 "$LOGS/version.log")" grep -q '^trainformer ' "$LOGS/version.log"

# doctor finds the image's constraints.txt and every pinned package matches its pin
VERSIONS_CHECK='import json, sys; v = json.load(sys.stdin)["versions"]; print("%d pins checked against %s, mismatches: %s" % (v["pinned"], v["constraints"], v["mismatches"] or "none")); sys.exit(0 if v["constraints"] and v["pinned"] > 50 and not v["mismatches"] else 1)'
engine run --rm "$IMAGE" bash -c "trainformer doctor --json | python -c '$VERSIONS_CHECK'" >"$LOGS/doctor.log" 2>&1
rc=$?
verdict doctor "$(tail -1 "$LOGS/doctor.log")" test $rc = 0
engine run --rm "$IMAGE" doctor >"$LOGS/doctor-report.log" 2>&1
say "doctor report (exit $?): $(grep -E '^ *constraints.txt' "$LOGS/doctor-report.log" | sed 's/  */ /g')"

# --- a tiny training run into a named volume, then its resume --------------------------------------
engine volume create "$VOLUME" >/dev/null
s=$(date +%s)
engine run --rm -v "$VOLUME:/workspace/runs" "$IMAGE" train --set train.steps=20 >"$LOGS/train.log" 2>&1
rc=$?
verdict train "20 steps, rc=$rc in $(($(date +%s) - s))s: $(grep -m1 'weights sha256' "$LOGS/train.log")" \
    grep -q 'weights sha256' "$LOGS/train.log"
s=$(date +%s)
engine run --rm -v "$VOLUME:/workspace/runs" "$IMAGE" train --set train.steps=30 >"$LOGS/resume.log" 2>&1
rc=$?
verdict resume "to 30 steps, rc=$rc in $(($(date +%s) - s))s: $(grep -m1 'resuming from' "$LOGS/resume.log")" \
    sh -c "[ $rc = 0 ] && grep -q 'resuming from checkpoint .* (step 20/30)' '$LOGS/resume.log'"

# --- SIGTERM during training (docker stop): a checkpoint, exit 0; metrics while it runs ------------
engine run -d --name "$NAME-sigterm" -v "$VOLUME:/workspace/runs" -e TRAINFORMER_METRICS_HOST=0.0.0.0 \
    -p "127.0.0.1:$METRICS_HOST_PORT:9400" "$IMAGE" train --run-dir runs/sigterm --metrics-port 9400 \
    --set train.steps=100000 --set train.log_every=10 --set train.checkpoint_every=100000 >/dev/null
if wait_for 600 sh -c "$ENGINE logs $NAME-sigterm 2>&1 | grep -q -E '^ *step +[0-9]+|step [0-9]+/'"; then
    curl -s --max-time 10 "http://127.0.0.1:$METRICS_HOST_PORT/metrics" >"$LOGS/metrics.log" 2>&1
    samples=$(grep -c '^trainformer_' "$LOGS/metrics.log")
    verdict metrics "$samples trainformer_ samples from /metrics" test "$samples" -gt 0
    s=$(date +%s)
    engine stop -t 120 "$NAME-sigterm" >/dev/null
    code=$(engine inspect "$NAME-sigterm" --format '{{.State.ExitCode}}')
    engine logs "$NAME-sigterm" >"$LOGS/sigterm.log" 2>&1
    engine run --rm -v "$VOLUME:/workspace/runs" "$IMAGE" bash -c 'ls runs/sigterm/checkpoints' \
        >"$LOGS/sigterm-checkpoints.log" 2>&1
    verdict sigterm "stopped in $(($(date +%s) - s))s, exit $code: $(grep -m1 'stopped at step' "$LOGS/sigterm.log" | cut -c1-80)" \
        sh -c "[ '$code' = 0 ] && grep -q 'stopped at step' '$LOGS/sigterm.log' && [ -s '$LOGS/sigterm-checkpoints.log' ]"
else
    engine logs "$NAME-sigterm" >"$LOGS/sigterm.log" 2>&1
    fail "sigterm: no step logged after 600 s (log: $LOGS/sigterm.log)"
fi
engine rm -f "$NAME-sigterm" >/dev/null 2>&1

# --- Jupyter: its token required ------------------------------------------------------------------
TOKEN="smoke-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
J="http://127.0.0.1:$JUPYTER_HOST_PORT"
engine run -d --name "$NAME-jupyter" -e JUPYTER_IP=0.0.0.0 -e JUPYTER_TOKEN="$TOKEN" \
    -p "127.0.0.1:$JUPYTER_HOST_PORT:8888" "$IMAGE" jupyter >/dev/null
if wait_for 180 sh -c "[ \$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 '$J/api/status?token=$TOKEN') = 200 ]"; then
    codes="$(http "$J/api/contents") $(http "$J/api/contents?token=wrong") $(http "$J/api/contents?token=$TOKEN") $(http -H "Authorization: token $TOKEN" "$J/api/contents")"
    verdict jupyter "no token, wrong token, token, header: HTTP $codes" test "$codes" = "403 403 200 200"
else
    fail "jupyter: not answering after 180 s"
fi
engine logs "$NAME-jupyter" >"$LOGS/jupyter.log" 2>&1
engine rm -f "$NAME-jupyter" >/dev/null 2>&1
engine run -d --name "$NAME-jupyter2" -p "127.0.0.1:$JUPYTER2_HOST_PORT:8888" "$IMAGE" jupyter >/dev/null
wait_for 180 sh -c "$ENGINE logs $NAME-jupyter2 2>&1 | grep -q 'is running at'"
engine logs "$NAME-jupyter2" >"$LOGS/jupyter2.log" 2>&1
code=$(http "http://127.0.0.1:$JUPYTER2_HOST_PORT/api/status")  # listens on the container's loopback
verdict jupyter-default "a generated token, loopback only (HTTP $code through the published port)" \
    sh -c "grep -q 'generated token: [0-9a-f]\{48\}' '$LOGS/jupyter2.log' && [ '$code' != 200 ]"
engine rm -f "$NAME-jupyter2" >/dev/null 2>&1

# --- SSH: a key only; the session has the image's PATH and settings ----------------------------
rm -f "$LOGS/client" "$LOGS/client.pub"
ssh-keygen -q -t ed25519 -N '' -C trainformer-smoke -f "$LOGS/client"
engine run -d --name "$NAME-ssh" -e SSH_AUTHORIZED_KEYS="$(cat "$LOGS/client.pub")" \
    -p "127.0.0.1:$SSH_HOST_PORT:2222" "$IMAGE" ssh >/dev/null
SSHO=(-p "$SSH_HOST_PORT" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes
      -o ConnectTimeout=10 -o LogLevel=ERROR)
if wait_for 60 sh -c "ssh-keyscan -p $SSH_HOST_PORT 127.0.0.1 2>/dev/null | grep -q ssh-ed25519"; then
    ssh "${SSHO[@]}" -i "$LOGS/client" trainformer@127.0.0.1 'trainformer --version' >"$LOGS/ssh-version.log" 2>&1
    verdict ssh-version "ssh HOST trainformer --version: $(tail -1 "$LOGS/ssh-version.log")" \
        grep -q '^trainformer ' "$LOGS/ssh-version.log"
    ssh "${SSHO[@]}" -i "$LOGS/client" trainformer@127.0.0.1 'bash -lc "command -v trainformer"' \
        >"$LOGS/ssh-login-shell.log" 2>&1
    verdict ssh-login-shell "a login shell finds $(tail -1 "$LOGS/ssh-login-shell.log")" \
        grep -qx /opt/venv/bin/trainformer "$LOGS/ssh-login-shell.log"
    ssh "${SSHO[@]}" -i "$LOGS/client" trainformer@127.0.0.1 \
        "trainformer doctor --json | python -c '$VERSIONS_CHECK'" >"$LOGS/ssh-doctor.log" 2>&1
    rc=$?
    verdict ssh-doctor "$(tail -1 "$LOGS/ssh-doctor.log")" test $rc = 0
    ssh "${SSHO[@]}" -o PubkeyAuthentication=no trainformer@127.0.0.1 true >"$LOGS/ssh-password.log" 2>&1
    verdict ssh-password "refused: $(tail -1 "$LOGS/ssh-password.log")" grep -q 'Permission denied (publickey)' "$LOGS/ssh-password.log"
    ssh "${SSHO[@]}" -i "$LOGS/client" root@127.0.0.1 true >"$LOGS/ssh-root.log" 2>&1
    verdict ssh-root "refused: $(tail -1 "$LOGS/ssh-root.log")" grep -q 'Permission denied' "$LOGS/ssh-root.log"
else
    fail "ssh: no sshd banner after 60 s"
fi
engine logs "$NAME-ssh" >"$LOGS/sshd.log" 2>&1
engine rm -f "$NAME-ssh" >/dev/null 2>&1

# --- TensorBoard on the runs volume ----------------------------------------------------------------
engine run -d --name "$NAME-tensorboard" -e TENSORBOARD_HOST=0.0.0.0 -p "127.0.0.1:$TB_HOST_PORT:6006" \
    -v "$VOLUME:/workspace/runs:ro" "$IMAGE" tensorboard >/dev/null
if wait_for 180 sh -c "[ \$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:$TB_HOST_PORT/) = 200 ]"; then
    curl -s --max-time 30 "http://127.0.0.1:$TB_HOST_PORT/data/runs" >"$LOGS/tensorboard.log" 2>&1
    verdict tensorboard "HTTP 200, runs: $(cut -c1-100 "$LOGS/tensorboard.log")" grep -q zh-bert-tiny "$LOGS/tensorboard.log"
else
    engine logs "$NAME-tensorboard" >"$LOGS/tensorboard.log" 2>&1
    fail "tensorboard: not answering after 180 s"
fi
engine rm -f "$NAME-tensorboard" >/dev/null 2>&1

# --- compose: the stack with the CPU override -------------------------------------------------------
if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then COMPOSE=(docker-compose)
elif podman compose version >/dev/null 2>&1; then COMPOSE=(podman compose)
else COMPOSE=()
fi
if [[ ${#COMPOSE[@]} -gt 0 ]]; then
    (cd "$ROOT" && "${COMPOSE[@]}" -f docker/compose.yaml -f docker/compose.cpu.yaml config) >"$LOGS/compose.log" 2>&1
    rc=$?
    verdict compose "${COMPOSE[*]} config with compose.cpu.yaml: rc=$rc, $(grep -c 'image: trainformer:cpu' "$LOGS/compose.log") services on trainformer:cpu, $(grep -c nvidia "$LOGS/compose.log") GPU reservations" \
        sh -c "[ $rc = 0 ] && [ \$(grep -c 'image: trainformer:cpu' '$LOGS/compose.log') = 3 ] && ! grep -q nvidia '$LOGS/compose.log'"
    (cd "$ROOT" && "${COMPOSE[@]}" -f docker/compose.yaml config) >"$LOGS/compose-gpu.log" 2>&1
    verdict compose-gpu "compose.yaml alone keeps the GPU reservation" grep -q 'driver: nvidia' "$LOGS/compose-gpu.log"
else
    skip "compose: no docker compose, docker-compose or podman compose here"
fi

say "done: $PASSED passed, $FAILED failed, $SKIPPED skipped in $(($(date +%s) - T0))s (logs: $LOGS)"
exit "$FAILED"
