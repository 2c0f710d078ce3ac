#!/bin/sh
# CAPTF runner: `terraform init`, then `terraform $CAPTF_OPERATION` (destroy or apply)
# against the object's state Secret through Terraform's kubernetes backend. OpenTofu's
# `tofu` runs instead when CAPTF_RUNTIME says so, or when the image has no `terraform`.
#
# POSIX sh, busybox compatible: the stock hashicorp/terraform image has busybox sh and
# tee, and no jq, so the controller renders every file this script
# needs (no JSON parsing here) into the read-only directory $CAPTF_RENDER_DIR:
#   runner.sh              this script
#   backend.hcl            namespace, secret_suffix and labels of the kubernetes backend
#   terraform.tfvars.json  the variables (passed with -var-file, so they win)
#   captf.auto.tfvars.json the module contract's variables (when any), copied beside the module
#   errored-backend.hcl    the backend settings for saving an errored.tfstate: the same
#                          namespace, and the labels of an errored state
#   module/...             the module's inline files, or
#   module-source          the module's source address (terraform init -from-module), or
#   module-path            the module's directory in this image (a module image)
#   terraform.lock.hcl     the provider lock file, when the inputs carry one
# Environment: CAPTF_OPERATION, CAPTF_NAMESPACE, CAPTF_SUFFIX,
# CAPTF_ERRORED_SUFFIX_BEFORE_TAG and _AFTER_TAG (the backend suffix an errored.tfstate is
# saved under, around the Pod's name tag),
# CAPTF_JOB_NAME (the Job's name: a lock left by an earlier Pod of it is broken),
# CAPTF_RUNTIME (terraform or tofu, when the inputs name one),
# CAPTF_PLAN_GUARD (1: an apply plans first, and a plan that destroys or replaces a
# resource is applied only when CAPTF_PLAN_APPROVED holds its hash), CAPTF_PLUGIN_DIR (the
# providers' directory in this image: every init takes them from there, no registry),
# CAPTF_RENDER_DIR, CAPTF_WORKSPACE (an emptyDir: HOME, TF_DATA_DIR, TMPDIR and the
# working copy live there, the root filesystem is read-only), and optionally
# CAPTF_TERMINATION_LOG (default /dev/termination-log), KUBE_CONFIG_PATH (a local runner:
# no in_cluster_config then), CAPTF_STATE_PROXY_PORT_FILE (the backend goes through the
# state proxy of the Pod, at the port that file holds, with no credentials of its own).
#
# Signals: a shell as PID 1 has no default signal handling, so Terraform runs as a child
# (in its own session when `setsid` exists, so that a signal sent to the whole process
# group reaches it once, not twice: two interrupts make Terraform exit at once without
# saving its state). TERM and INT are trapped and forwarded to Terraform, then the
# script waits for Terraform to save its state and exit.
#
# Exit status: Terraform's; 143 after SIGTERM (130 after SIGINT), whatever Terraform
# returned, so that the controller sees an interrupted run; never 0 when Terraform left
# an errored.tfstate; 3 when the plan guard stopped an apply before it changed anything
# (the termination log then starts with "captf-runner: destructive plan HASH", then one
# line per resource the plan would destroy or replace). On failure the tail of Terraform's error output (ANSI codes
# stripped) is written to the termination log, which the controller copies into the
# Deleting condition.
set -u

RENDER="${CAPTF_RENDER_DIR:-/captf/render}"
WS="${CAPTF_WORKSPACE:-/workspace}"
WORK="$WS/work"
OP="${CAPTF_OPERATION:-}"
TERMLOG="${CAPTF_TERMINATION_LOG:-/dev/termination-log}"
STDERR_LOG="$WS/terraform-stderr.log"
FIFO="$WS/terraform-stderr.fifo"
VARS="$WS/captf.tfvars.json"
BACKEND="$WS/backend.hcl"
# Where init installs the modules of remote `module` blocks, as its modules.json names it.
MODULES_DIR="${TF_DATA_DIR:-.terraform}/modules"
ESC=$(printf '\033')
# Kubelet keeps 4096 bytes of the termination message; keep well below.
TAIL_BYTES=2800

TF_PID=""
PROXY_PORT=""
PROXY_KUBECONFIG="$WS/state-proxy.kubeconfig"
SIGNALLED=""
WAITED=0

log() { printf 'captf-runner: %s\n' "$*" >&2; }

# message HEADER: writes HEADER and the tail of the last Terraform command's stderr,
# without ANSI escape sequences, to the termination log.
message() {
    {
        printf '%s\n' "$1"
        if [ -s "$STDERR_LOG" ]; then
            sed "s/${ESC}\[[0-9;?]*[A-Za-z]//g" "$STDERR_LOG" | tail -c "$TAIL_BYTES"
        fi
    } > "$TERMLOG" 2>/dev/null || log "cannot write the termination log $TERMLOG"
}

# fail STATUS TEXT: the runner itself failed (not Terraform).
fail() {
    fail_status=$1
    shift
    log "$*"
    : > "$STDERR_LOG" 2>/dev/null
    message "captf-runner: $*"
    exit "$fail_status"
}

on_signal() {
    SIGNALLED=$1
    if [ -n "$TF_PID" ]; then
        log "received SIG$1: forwarding it to ${TF:-terraform} (pid $TF_PID) and waiting for it to save its state"
        kill -s "$1" "$TF_PID" 2>/dev/null || true
    else
        log "received SIG$1"
    fi
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

# wait_for PID: waits until PID has exited and leaves its status in WAITED. A trapped
# signal interrupts `wait` with a status above 128 while the child runs on (a zombie
# still answers `kill -0` until it is reaped): wait again for its real status.
wait_for() {
    while :; do
        wait "$1"
        WAITED=$?
        if [ "$WAITED" -gt 128 ] && kill -0 "$1" 2>/dev/null; then
            continue
        fi
        return 0
    done
}

SETSID=""
if command -v setsid > /dev/null 2>&1; then
    SETSID=setsid
fi

# run_tf ARGS...: runs $TF (terraform or tofu) as a child, its stderr both to the log and
# to $STDERR_LOG; returns its exit status.
run_tf() {
    log "running: $TF $*"
    rm -f "$FIFO"
    mkfifo "$FIFO" || fail 1 "cannot create the fifo $FIFO"
    # tee ignores TERM and INT: were it killed by a signal sent to the whole process
    # group, Terraform would die of SIGPIPE at its next write to stderr.
    (
        trap '' TERM INT
        exec tee "$STDERR_LOG" < "$FIFO" >&2
    ) &
    tee_pid=$!
    if [ -n "$SETSID" ]; then
        $SETSID "$TF" "$@" 2> "$FIFO" &
    else
        "$TF" "$@" 2> "$FIFO" &
    fi
    TF_PID=$!
    # A signal that came before TF_PID was known has not been forwarded yet.
    if [ -n "$SIGNALLED" ]; then
        kill -s "$SIGNALLED" "$TF_PID" 2>/dev/null || true
    fi
    wait_for "$TF_PID"
    run_status=$WAITED
    TF_PID=""
    wait_for "$tee_pid"
    rm -f "$FIFO"
    return "$run_status"
}

# The exit status after a signal, else $1.
final_status() {
    case "$SIGNALLED" in
        TERM) echo 143 ;;
        INT) echo 130 ;;
        *) echo "$1" ;;
    esac
}

# stop_if_signalled: no further step once a signal came.
stop_if_signalled() {
    if [ -n "$SIGNALLED" ]; then
        message "captf-runner: interrupted by SIG$SIGNALLED before ${TF:-terraform} $OP ran"
        exit "$(final_status 1)"
    fi
}

# api_settings: how the backend reaches the API server: through the state proxy beside
# this container (CAPTF_STATE_PROXY_PORT_FILE: the Pod's token is the proxy's alone), else
# with the Pod's in-cluster credentials, else (KUBE_CONFIG_PATH, a local runner) as the
# kubeconfig says.
api_settings() {
    if [ -n "${CAPTF_STATE_PROXY_PORT_FILE:-}" ]; then
        printf 'config_path = "%s"\n' "$PROXY_KUBECONFIG"
    elif [ -z "${KUBE_CONFIG_PATH:-}" ]; then
        printf 'in_cluster_config = true\n'
    fi
    return 0
}

# save_errored: pushes errored.tfstate through Terraform's own kubernetes backend into a
# state of its own, under the backend suffix $CAPTF_ERRORED_SUFFIX_BEFORE_TAG, this Pod's
# name tag, $CAPTF_ERRORED_SUFFIX_AFTER_TAG (errored-<attempt>-<tag>.<suffix>), so that
# every attempt, and every Pod of one, keeps its own. The backend stores it as it stores
# any state: gzip-compressed, chunked under the Secret size limit, labelled (the labels of
# errored-backend.hcl mark it as an errored state, which cleanup never deletes), over the
# Pod's verified in-cluster TLS. Never in a workspace of the object's own suffix: there,
# the backend's default workspace is the object's state. Sets ERRORED_SECRET. Returns
# non-zero when it could not.
save_errored() {
    e_tag=${HOSTNAME:-$(hostname 2>/dev/null)}
    case "$e_tag" in
        *-?????) e_tag=${e_tag##*-} ;;
        *) e_tag=$(date +%s | tail -c 6) ;;
    esac
    e_suffix="${CAPTF_ERRORED_SUFFIX_BEFORE_TAG:-errored-}$e_tag${CAPTF_ERRORED_SUFFIX_AFTER_TAG:-.${CAPTF_SUFFIX:-}}"
    ERRORED_SECRET="tfstate-default-$e_suffix"
    e_dir="$WS/errored"
    mkdir -p "$e_dir" || return 1
    printf 'terraform {\n  backend "kubernetes" {}\n}\n' > "$e_dir/captf_backend.tf" || return 1
    {
        cat "$RENDER/errored-backend.hcl" &&
            printf 'secret_suffix = "%s"\n' "$e_suffix" &&
            api_settings
    } > "$e_dir/backend.hcl" || return 1
    log "saving errored.tfstate as the state of suffix $e_suffix (Secret $ERRORED_SECRET)"
    # In a subshell, in a directory and data directory of its own: init (which makes the
    # new suffix's default workspace, an empty state) and the push, without a lock
    # (nothing else knows this state).
    (
        cd "$e_dir" || exit 1
        unset TF_WORKSPACE
        export TF_DATA_DIR="$e_dir/.terraform"
        "$TF" init -input=false -no-color -backend-config=backend.hcl > "$e_dir/init.log" 2>&1 ||
            { cat "$e_dir/init.log" >&2; exit 1; }
        "$TF" state push -lock=false "$WORK/errored.tfstate"
    ) < /dev/null
}

# stale_own_lock: whether the last Terraform command failed on a state lock held by an
# earlier Pod of this same Job (its host name is the Job's Pod name prefix and five
# characters, and it is not this Pod). With podReplacementPolicy Failed, the Job controller makes this Pod only
# once that one has stopped, so its Terraform is gone and the lock is stale. Sets
# LOCK_ID and LOCK_WHO.
stale_own_lock() {
    [ -n "${CAPTF_JOB_NAME:-}" ] || return 1
    [ -s "$STDERR_LOG" ] || return 1
    l_text=$(sed "s/${ESC}\[[0-9;?]*[A-Za-z]//g" "$STDERR_LOG")
    case "$l_text" in *"Error acquiring the state lock"*) ;; *) return 1 ;; esac
    LOCK_WHO=$(printf '%s\n' "$l_text" | sed -n 's/.*Who:[[:space:]]*//p' | head -n 1)
    LOCK_ID=$(printf '%s\n' "$l_text" | sed -n 's/^[^A-Za-z]*ID:[[:space:]]*//p' | head -n 1)
    l_host=${LOCK_WHO#*@}
    l_me=$(hostname 2>/dev/null || printf '%s' "${HOSTNAME:-}")
    [ -n "$LOCK_ID" ] && [ -n "$l_host" ] && [ "$l_host" != "$l_me" ] || return 1
    # A Job's Pods are named "<job name>-" cut to 58 characters, and 5 random ones.
    l_base=$(printf '%s-' "$CAPTF_JOB_NAME" | cut -c1-58)
    case "$l_host" in
        "$l_base"?????) return 0 ;;
    esac
    return 1
}

# tf_failed STEP STATUS: Terraform failed; report and exit.
tf_failed() {
    tf_status=$(final_status "$2")
    if [ -n "$SIGNALLED" ]; then
        message "$TF $1 interrupted by SIG$SIGNALLED ($TF exited $2)"
    else
        message "$TF $1 failed (exit $2)"
    fi
    exit "$tf_status"
}

case "$OP" in
    apply | destroy) ;;
    *) fail 2 "CAPTF_OPERATION must be apply or destroy, not '$OP'" ;;
esac
# The runtime: the one the inputs name, else terraform, else tofu (an OpenTofu image).
TF="${CAPTF_RUNTIME:-}"
if [ -z "$TF" ]; then
    if command -v terraform > /dev/null 2>&1; then
        TF=terraform
    elif command -v tofu > /dev/null 2>&1; then
        TF=tofu
    else
        fail 127 "neither terraform nor tofu is on PATH in the runner image"
    fi
fi
case "$TF" in
    terraform | tofu) ;;
    *) fail 2 "CAPTF_RUNTIME must be terraform or tofu, not '$TF'" ;;
esac
command -v "$TF" > /dev/null 2>&1 || fail 127 "$TF is not on PATH in the runner image (the inputs' runner.runtime names it)"

mkdir -p "$WORK" "${HOME:-$WS/home}" "${TF_DATA_DIR:-$WS/.terraform-data}" "${TMPDIR:-$WS/tmp}" ||
    fail 1 "cannot create the working directories under $WS"
cd "$WORK" || fail 1 "cannot enter $WORK"
stop_if_signalled

# 1. The module. `init -from-module` needs an empty directory: it runs first, without
# the backend, and the second init below configures the backend.
if [ -f "$RENDER/module-source" ] && [ -n "${CAPTF_PLUGIN_DIR:-}" ]; then
    run_tf init -input=false -no-color -backend=false -plugin-dir="$CAPTF_PLUGIN_DIR" \
        -from-module="$(cat "$RENDER/module-source")" || tf_failed init $?
elif [ -f "$RENDER/module-source" ]; then
    run_tf init -input=false -no-color -backend=false -from-module="$(cat "$RENDER/module-source")" ||
        tf_failed init $?
elif [ -f "$RENDER/module-path" ]; then
    m_path=$(cat "$RENDER/module-path")
    [ -d "$m_path" ] || fail 1 "the module's directory $m_path (module.path) is not in the runner image"
    cp -R "$m_path/." "$WORK/" || fail 1 "cannot copy the module from $m_path"
elif [ -d "$RENDER/module" ]; then
    cp -R "$RENDER/module/." "$WORK/" || fail 1 "cannot copy the module files from $RENDER/module"
else
    fail 1 "$RENDER has neither module-source nor module/"
fi
stop_if_signalled

# 2. CAPTF's files. An `_override.tf` file merges into the module's terraform block, so
# the backend is the kubernetes backend whatever the module says.
printf 'terraform {\n  backend "kubernetes" {}\n}\n' > "$WORK/captf_backend_override.tf" ||
    fail 1 "cannot write the backend override"
cp "$RENDER/terraform.tfvars.json" "$VARS" || fail 1 "cannot copy the variables"
# The module contract's variables: Terraform reads a *.auto.tfvars.json file in the
# module's directory by itself, and a module declares only those it uses.
if [ -f "$RENDER/captf.auto.tfvars.json" ]; then
    cp "$RENDER/captf.auto.tfvars.json" "$WORK/captf.auto.tfvars.json" ||
        fail 1 "cannot copy the contract variables"
fi
if [ -f "$RENDER/terraform.lock.hcl" ]; then
    cp "$RENDER/terraform.lock.hcl" "$WORK/.terraform.lock.hcl" || fail 1 "cannot copy the lock file"
fi
if [ -n "${CAPTF_STATE_PROXY_PORT_FILE:-}" ]; then
    # The state proxy beside this container writes the port it listens on when it is
    # ready: wait for it, at most a minute.
    p_waited=0
    while [ ! -s "$CAPTF_STATE_PROXY_PORT_FILE" ]; do
        [ "$p_waited" -lt 60 ] ||
            fail 1 "the state proxy wrote no port to $CAPTF_STATE_PROXY_PORT_FILE in 60 s: read the logs of the Pod's container captf-state-proxy"
        sleep 1
        p_waited=$((p_waited + 1))
    done
    PROXY_PORT=$(tr -cd '0-9' < "$CAPTF_STATE_PROXY_PORT_FILE")
    [ -n "$PROXY_PORT" ] || fail 1 "the state proxy's port file $CAPTF_STATE_PROXY_PORT_FILE holds no port"
    # A kubeconfig naming the proxy and no credentials: the backend's `host` alone is not
    # enough, it first loads a configuration and finds none without a token.
    printf '%s\n' "apiVersion: v1" "kind: Config" \
        "clusters: [{name: state-proxy, cluster: {server: \"http://127.0.0.1:$PROXY_PORT\"}}]" \
        "users: [{name: state-proxy, user: {}}]" \
        "contexts: [{name: state-proxy, context: {cluster: state-proxy, user: state-proxy}}]" \
        "current-context: state-proxy" > "$PROXY_KUBECONFIG" ||
        fail 1 "cannot write the state proxy's kubeconfig"
fi
# Written whole, not copied and appended to: the render volume's files are read-only
# (mode 0444), and so is a copy of one.
{ cat "$RENDER/backend.hcl" && api_settings; } > "$BACKEND" || fail 1 "cannot write backend.hcl"

# The modules the apply's init installed for the module's remote `module` blocks: put
# back where init looks first, so that it uses them and fetches nothing (their
# modules.json names the directory they are in).
if [ -d "$RENDER/installed-modules" ]; then
    mkdir -p "$MODULES_DIR" && cp -R "$RENDER/installed-modules/." "$MODULES_DIR/" ||
        fail 1 "cannot put back the modules the apply installed"
    rm -f "$MODULES_DIR/modules.json"
    sed "s#@CAPTF_MODULES_DIR@#$MODULES_DIR#g" "$RENDER/installed-modules/modules.json" > "$MODULES_DIR/modules.json" ||
        fail 1 "cannot write the installed modules' modules.json"
fi

# 3. init, then the operation.
if [ -n "${CAPTF_PLUGIN_DIR:-}" ]; then
    [ -d "$CAPTF_PLUGIN_DIR" ] || fail 1 "the providers' directory $CAPTF_PLUGIN_DIR (runner.pluginDir) is not in the runner image"
    run_tf init -input=false -no-color -plugin-dir="$CAPTF_PLUGIN_DIR" -backend-config="$BACKEND" ||
        tf_failed init $?
else
    run_tf init -input=false -no-color -backend-config="$BACKEND" || tf_failed init $?
fi
stop_if_signalled

# The plan guard (an apply after the object's first success): plan into a file, list what
# the plan destroys or replaces from Terraform's own rendering of it, and apply exactly
# that plan only when nothing is destroyed or replaced, or when the operator approved the
# list's hash. Terraform refuses to apply a saved plan whose state changed since it was
# made, so what was approved is what runs.
PLAN="$WS/captf.tfplan"
DESTRUCTIVE="$WS/destructive.txt"
BLOCKED=""
operation() {
    if [ "$OP" != apply ] || [ "${CAPTF_PLAN_GUARD:-}" != 1 ]; then
        run_tf "$OP" -auto-approve -input=false -no-color -var-file="$VARS"
        return
    fi
    run_tf plan -input=false -no-color -out="$PLAN" -var-file="$VARS" || return
    stop_if_signalled
    "$TF" show -no-color "$PLAN" > "$WS/plan.txt" 2> "$STDERR_LOG" || return
    # "  # ADDRESS must be replaced", "… is tainted, so must be replaced", "… will be
    # replaced, as requested", "… will be destroyed" (a deposed object's too).
    sed -n \
        -e 's/^  # \(.*\) is tainted, so must be replaced$/replace \1/p' \
        -e 's/^  # \(.*\) must be replaced$/replace \1/p' \
        -e 's/^  # \(.*\) will be replaced, as requested$/replace \1/p' \
        -e 's/^  # \(.*\) will be destroyed$/delete \1/p' \
        "$WS/plan.txt" | sort -u > "$DESTRUCTIVE" || return
    if [ -s "$DESTRUCTIVE" ]; then
        p_hash=$(sha256sum < "$DESTRUCTIVE" | cut -c1-16)
        if [ "${CAPTF_PLAN_APPROVED:-}" != "$p_hash" ]; then
            log "the plan destroys or replaces $(wc -l < "$DESTRUCTIVE" | tr -d ' ') resource(s), and plan $p_hash is not approved: nothing is applied"
            sed 's/^/captf-runner: would /' "$DESTRUCTIVE" >&2
            BLOCKED=$p_hash
            return 3
        fi
        log "the plan destroys or replaces $(wc -l < "$DESTRUCTIVE" | tr -d ' ') resource(s); plan $p_hash is approved: applying it"
    fi
    stop_if_signalled
    run_tf apply -auto-approve -input=false -no-color "$PLAN"
}
operation
status=$?
if [ "$status" -ne 0 ] && [ -z "$SIGNALLED" ] && [ -z "$BLOCKED" ] && stale_own_lock; then
    log "the state lock is held by $LOCK_WHO, an earlier Pod of this Job ($CAPTF_JOB_NAME), stopped by a disruption before its Terraform could unlock; the Job makes a new Pod only once the old one has stopped, so the lock is stale: breaking it"
    if run_tf force-unlock -force "$LOCK_ID"; then
        operation
        status=$?
    fi
fi
if [ -n "$BLOCKED" ] && [ -z "$SIGNALLED" ]; then
    {
        printf 'captf-runner: destructive plan %s\n' "$BLOCKED"
        head -c "$TAIL_BYTES" "$DESTRUCTIVE"
    } > "$TERMLOG" 2>/dev/null || log "cannot write the termination log $TERMLOG"
    exit 3
fi

# 4. A state Terraform could not save.
if [ -f "$WORK/errored.tfstate" ]; then
    log "=================================================================="
    log "TERRAFORM COULD NOT SAVE ITS STATE: it wrote errored.tfstate."
    log "The resources it describes may not be in the state Secret."
    if save_errored; then
        where="saved in Secret ${CAPTF_NAMESPACE:-}/$ERRORED_SECRET"
    else
        where="NOT saved (see the log)"
    fi
    log "errored.tfstate $where; follow the runbook before retrying."
    log "=================================================================="
    if [ "$status" -eq 0 ]; then status=1; fi
    message "$TF could not save its state: errored.tfstate $where ($TF $OP exited $status)"
    exit "$(final_status "$status")"
fi

if [ "$status" -ne 0 ] || [ -n "$SIGNALLED" ]; then
    tf_failed "$OP" "$status"
fi
log "$TF $OP succeeded"

# 5. What an apply ran, for the destroy to run the same offline (job/report.rs reads it
# from the Pod's log): the lock file init wrote when the inputs gave none, and the
# module's files when they came from a source address, and the modules init installed
# for its remote `module` blocks; base64, one line each, counted. `find -L`: init keeps a
# module's symbolic links, and a link is reported as the file Terraform read through it,
# when it stays inside its directory (what a link outside names is not the module's).
inside() { # inside DIR FILE: FILE resolves to a path under DIR
    i_dir=$(readlink -f "$1") && i_file=$(readlink -f "$1/$2") || return 1
    case "$i_file" in "$i_dir"/*) return 0 ;; esac
    log "not reported: $2 links outside its module ($i_file)"
    return 1
}
if [ "$OP" = apply ]; then
    r_lines="$WS/ran.report"
    : > "$r_lines"
    if [ ! -f "$RENDER/terraform.lock.hcl" ] && [ -f "$WORK/.terraform.lock.hcl" ]; then
        printf 'captf-runner: ran lock %s\n' "$(base64 < "$WORK/.terraform.lock.hcl" | tr -d '\n')" >> "$r_lines"
    fi
    if [ -f "$RENDER/module-source" ]; then
        (cd "$WORK" && find -L . -type f ! -path './.terraform/*' ! -name captf_backend_override.tf \
            ! -name captf.auto.tfvars.json ! -name .terraform.lock.hcl ! -name errored.tfstate \
            ! -name 'terraform.tfstate*' | sort) | while IFS= read -r r_file; do
            r_file=${r_file#./}
            inside "$WORK" "$r_file" || continue
            printf 'captf-runner: ran module-file %s %s\n' "$r_file" "$(base64 < "$WORK/$r_file" | tr -d '\n')"
        done >> "$r_lines"
    fi
    if [ -f "$MODULES_DIR/modules.json" ] &&
        [ -n "$(cd "$MODULES_DIR" && find -L . -type f ! -name modules.json ! -path '*/.git/*' | head -n 1)" ]; then
        (cd "$MODULES_DIR" && find -L . -type f ! -path '*/.git/*' | sort) | while IFS= read -r r_file; do
            r_file=${r_file#./}
            inside "$MODULES_DIR" "$r_file" || continue
            if [ "$r_file" = modules.json ]; then
                r_b64=$(sed "s#$MODULES_DIR#@CAPTF_MODULES_DIR@#g" "$MODULES_DIR/modules.json" | base64 | tr -d '\n')
            else
                r_b64=$(base64 < "$MODULES_DIR/$r_file" | tr -d '\n')
            fi
            printf 'captf-runner: ran installed-module %s %s\n' "$r_file" "$r_b64"
        done >> "$r_lines"
    fi
    printf 'captf-runner: ran begin\n'
    cat "$r_lines"
    printf 'captf-runner: ran end %s\n' "$(wc -l < "$r_lines" | tr -d ' ')"
fi
exit 0
