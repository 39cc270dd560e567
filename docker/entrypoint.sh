#!/usr/bin/env bash
# The trainformer image's entrypoint: one verb, then exec the process that serves it, so that
# `docker stop` (SIGTERM) reaches it directly.
#
#   jupyter [ARG]       Jupyter Lab in NOTEBOOK_DIR, token required (+ sshd when a key is given)
#   ssh                 sshd alone, in the foreground, public keys only
#   tensorboard [ARG]   TensorBoard on RUNS_DIR (extra arguments are appended: a later flag wins)
#   bash | sh [ARG]     a shell
#   help                this text
#   anything else       `trainformer ARGS...`: train, eval, predict, bench, launch, serve, --version
#
# Every path and address comes from the environment, so the script also runs outside the
# image (the tests run it on the host).
set -euo pipefail

HOME="${HOME:-/home/trainformer}"
NOTEBOOK_DIR="${NOTEBOOK_DIR:-$PWD}"
RUNS_DIR="${RUNS_DIR:-runs}"
# Jupyter's token can leak through URLs, logs and shell history, so it listens on the
# container's loopback unless asked (JUPYTER_IP=0.0.0.0 for `docker run -p 8888:8888`).
JUPYTER_IP="${JUPYTER_IP:-127.0.0.1}"
JUPYTER_PORT="${JUPYTER_PORT:-8888}"
TENSORBOARD_HOST="${TENSORBOARD_HOST:-127.0.0.1}"  # TensorBoard has no authentication at all
TENSORBOARD_PORT="${TENSORBOARD_PORT:-6006}"
# sshd accepts public keys only, so being reachable is the point of starting it: it listens on
# every interface. `ssh -L 8888:127.0.0.1:8888` through it reaches a loopback-only Jupyter.
SSH_LISTEN="${SSH_LISTEN:-0.0.0.0}"
SSH_PORT="${SSH_PORT:-2222}"  # the image runs as a user, who cannot bind ports below 1024
SSH_DIR="${SSH_DIR:-$HOME/.ssh}"      # authorized_keys
SSHD_DIR="${SSHD_DIR:-$HOME/.sshd}"   # host key, generated sshd_config, pid file
SSHD="${SSHD:-/usr/sbin/sshd}"

usage() {
    sed -n '2,10s/^# \{0,1\}//p' "$0"
}

fail() {
    echo "entrypoint: error: $*" >&2
    exit 2
}

# SSH_AUTHORIZED_KEYS (one or more public key lines) -> $SSH_DIR/authorized_keys.
# Succeeds when there is a key to accept: from the variable or a mounted file.
write_authorized_keys() {
    mkdir -p "$SSH_DIR" && chmod 700 "$SSH_DIR"
    if [[ -n "${SSH_AUTHORIZED_KEYS:-}" ]]; then
        (umask 077 && printf '%s\n' "$SSH_AUTHORIZED_KEYS" >"$SSH_DIR/authorized_keys")
    fi
    [[ -s "$SSH_DIR/authorized_keys" ]]
}

# sshd starts its sessions with an environment of its own (PATH=/usr/local/bin:/usr/bin:/bin:...,
# no /opt/venv/bin: `ssh HOST trainformer` would not be found), and without PAM /etc/environment
# is never read. SetEnv lines pass this container's settings on: PATH, the locale, and the
# TRAINFORMER_*, TF_*, CUDA_VISIBLE_DEVICES, NVIDIA_*, PIP_* and PYTHON* variables (the image's
# ENV and `docker run -e`). A value sshd could not read back (a quote, a backslash) is left out.
# One line: sshd takes the first SetEnv line and ignores any other.
session_environment() {
    local name line=""
    for name in $(compgen -e); do
        [[ "$name" =~ ^(PATH|LANG|LC_ALL|CUDA_VISIBLE_DEVICES|(TRAINFORMER|TF|NVIDIA|PIP)_[A-Z0-9_]+|PYTHON[A-Z0-9_]+)$ ]] \
            || continue
        case "${!name}" in *[\"\\]* | *$'\n'*) continue ;; esac
        line+=" \"$name=${!name}\""
    done
    [[ -z "$line" ]] || echo "SetEnv$line"
}

# A host key (kept across restarts when SSHD_DIR is a volume) and an sshd_config for an sshd
# that runs as this user: only this user can log in, and only with a key.
write_sshd_config() {
    mkdir -p "$SSHD_DIR" && chmod 700 "$SSHD_DIR"
    if [[ ! -f "$SSHD_DIR/ssh_host_ed25519_key" ]]; then
        ssh-keygen -q -t ed25519 -N '' -C "trainformer host key" -f "$SSHD_DIR/ssh_host_ed25519_key"
    fi
    cat >"$SSHD_DIR/sshd_config" <<EOF
# Written by the trainformer entrypoint at each start; edits are overwritten.
Port $SSH_PORT
ListenAddress $SSH_LISTEN
HostKey $SSHD_DIR/ssh_host_ed25519_key
PidFile $SSHD_DIR/sshd.pid
AuthorizedKeysFile $SSH_DIR/authorized_keys
AllowUsers $(id -un)
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
PermitRootLogin no
# PAM needs root; without it sshd checks the key itself.
UsePAM no
X11Forwarding no
PrintMotd no
Subsystem sftp internal-sftp
$(session_environment)
EOF
}

# Writes sshd's keys and config and sets SSHD_COMMAND; fails when no key is given.
prepare_sshd() {
    write_authorized_keys || fail "ssh: no public key: set SSH_AUTHORIZED_KEYS or mount $SSH_DIR/authorized_keys"
    write_sshd_config
    echo "ssh: sshd on $SSH_LISTEN:$SSH_PORT, public keys only, user $(id -un)" >&2
    SSHD_COMMAND=("$SSHD" -D -e -f "$SSHD_DIR/sshd_config")
}

run_jupyter() {
    mkdir -p "$NOTEBOOK_DIR"
    if [[ -n "${SSH_AUTHORIZED_KEYS:-}" || -s "$SSH_DIR/authorized_keys" ]]; then
        prepare_sshd
        # In the background: Jupyter is the main process; `tini -g` (the image's init) passes
        # SIGTERM to both.
        "${SSHD_COMMAND[@]}" &
    fi
    # An empty token would switch authentication off: generate one instead.
    if [[ -z "${JUPYTER_TOKEN:-}" && -z "${JUPYTER_TOKEN_FILE:-}" ]]; then
        JUPYTER_TOKEN="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
        echo "jupyter: generated token: $JUPYTER_TOKEN"
        echo "jupyter: open http://$JUPYTER_IP:$JUPYTER_PORT/lab?token=$JUPYTER_TOKEN (set JUPYTER_TOKEN to choose it)"
    fi
    export JUPYTER_TOKEN  # read by jupyter_server; kept off the command line, which `ps` shows
    local root=()
    # The image runs as a user; `docker run --user 0` (or a test run as root) needs the flag.
    [[ "$(id -u)" != 0 ]] || root=(--allow-root)
    exec jupyter lab --no-browser "${root[@]}" --ip="$JUPYTER_IP" --port="$JUPYTER_PORT" \
        --ServerApp.port_retries=0 --ServerApp.root_dir="$NOTEBOOK_DIR" "$@"
}

verb="${1:-help}"
case "$verb" in
    jupyter) shift && run_jupyter "$@" ;;
    ssh) prepare_sshd && exec "${SSHD_COMMAND[@]}" ;;
    tensorboard)
        shift
        exec tensorboard --logdir "$RUNS_DIR" --host "$TENSORBOARD_HOST" --port "$TENSORBOARD_PORT" "$@" ;;
    bash | sh) exec "$@" ;;
    help | -h | --help) usage ;;
    *) exec trainformer "$@" ;;
esac
