#!/usr/bin/env bash
# Shared by deploy, bootstrap and watchdog: the server layout, logging, the
# one server lock, the numbers generated from the timing contract, bounded
# Docker calls, releases and atomic installs. Sourced, never run.
#
# Settings (production defaults; the tests and the rehearsal set them per
# simulated server):
#   MYTHEX_ROOT        server directory: releases/, current, state/, lock
#                      (default /opt/mythex)
#   MYTHEX_LOCK        the one lock of the server (default $MYTHEX_ROOT/mythex.lock)
#   MYTHEX_PROJECT     compose project name (default mythex)
#   MYTHEX_TIMING_ENV  numbers generated from infra.Timing (default: the
#                      timing.env beside the script)
#   MYTHEX_RELEASE_DIR where deploy and bootstrap take compose.yaml and its
#                      checksum from (default: the script's directory)
#   MYTHEX_LOCK_HELD_FD  set by remote-deploy, which holds the server lock on
#                      this inherited descriptor across bootstrap and deploy:
#                      the scripts use that hold and leave releasing it to it
#   MYTHEX_CRITICAL_SECTION_CMD  test seam: run this command while holding
#                      the lock instead of the script's work (from the
#                      environment only, never from timing.env)
#
# Layout: a release is a directory releases/<version>-<hash> holding
# compose.yaml, its checksum and deployed.env (the values compose
# interpolates), written once and never changed. The symlink `current` names
# the release the server runs; a deploy switches it with one rename, so a
# reader sees the old release or the new one, never half of each. The
# symlink `previous` beside it names the release the server ran before, of
# another version: what a rollback returns to, never pruned.
#
# Every step that can fail is checked where it runs, with `|| return` or
# `|| die`: these functions are called from `if`, `||` and `!`, where
# `set -e` does nothing.

# The globals below are read by the scripts that source this file (SC2034).
# Command substitutions are `...`, never $(...): see deploy, which traps
# signals (SC2006).
# shellcheck disable=SC2034,SC2006
true

shopt -s inherit_errexit

readonly SCRIPT="${0##*/}"
HOOKS_DIR=`dirname "${BASH_SOURCE[0]}"`
HOOKS_DIR=`cd "$HOOKS_DIR" && pwd`
readonly HOOKS_DIR
readonly MYTHEX_ROOT="${MYTHEX_ROOT:-/opt/mythex}"
readonly MYTHEX_LOCK="${MYTHEX_LOCK:-$MYTHEX_ROOT/mythex.lock}"
readonly MYTHEX_PROJECT="${MYTHEX_PROJECT:-mythex}"
readonly MYTHEX_TIMING_ENV="${MYTHEX_TIMING_ENV:-$HOOKS_DIR/timing.env}"
readonly MYTHEX_RELEASE_DIR="${MYTHEX_RELEASE_DIR:-$HOOKS_DIR}"
readonly RELEASES_DIR="$MYTHEX_ROOT/releases"
readonly CURRENT="$MYTHEX_ROOT/current"
readonly PREVIOUS="$MYTHEX_ROOT/previous"
readonly COMPOSE_NAME="compose.yaml"
readonly CHECKSUM_NAME="compose.yaml.sha256"
readonly VALUES_NAME="deployed.env"
# In a release directory: which hooks deployed it (hook-releases/<id>), so a
# rollback to it runs those hooks again. Absent when none were installed.
readonly HOOKS_REF_NAME="hooks.ref"
# The installed hooks: $MYTHEX_ROOT/hooks links to one whole directory of
# hook-releases/, named by the first 16 hex digits of hooks_sum.
readonly HOOK_RELEASES="$MYTHEX_ROOT/hook-releases"
readonly HOOKS_LINK="$MYTHEX_ROOT/hooks"
# What a hooks directory holds, with each file's mode: the scripts, their
# numbers and the watchdog's unit templates, all a rollback needs to install
# the hooks of the release before again.
readonly HOOK_FILES=("deploy 0755" "watchdog 0755" "bootstrap 0755" "lib.sh 0644" "timing.env 0644"
  "mythex-watchdog.service 0644" "mythex-watchdog.timer 0644")
readonly STATE_DIR="$MYTHEX_ROOT/state"
# The header that marks a health check as the server's own, not a balancer
# node's: drain.HeaderSelfCheck (TestHooksCheckHealthAsTheServersOwn).
readonly SELF_CHECK_HEADER="X-Mythex-Self-Check"
readonly STRIKES_FILE="$STATE_DIR/strikes"
# Present from the moment a deploy may change what runs until it has
# finished: found by a later run, it means that deploy was killed.
readonly DEPLOYING_FILE="$STATE_DIR/deploying"
# How every deploy ended, for whoever asks after its caller went away.
readonly LAST_DEPLOY_FILE="$STATE_DIR/last-deploy"
# Who took the lock last, and since when the watchdog has found it held.
readonly LOCK_HOLDER_FILE="$STATE_DIR/lock-holder"
readonly LOCK_BUSY_FILE="$STATE_DIR/lock-busy"
# Exit status when the lock stays held past the bound (EX_TEMPFAIL): the
# caller may retry later.
readonly EXIT_LOCKED=75
# The keys timing.env must define, and the only ones it may; durations end
# in _MS.
readonly TIMING_KEYS=(MYTHEX_LOCK_WAIT_MS MYTHEX_START_TIMEOUT_MS
  MYTHEX_STOP_GRACE_PERIOD_MS MYTHEX_CONTAINER_HEALTH_INTERVAL_MS
  MYTHEX_CONTAINER_HEALTH_TIMEOUT_MS MYTHEX_SETTLE_MS MYTHEX_SETTLE_CHECKS
  MYTHEX_WATCHDOG_INTERVAL_MS
  MYTHEX_DEPLOY_DOWNTIME_MS MYTHEX_WATCHDOG_HOLD_MS MYTHEX_DEPLOY_HOLD_MS MYTHEX_REMOTE_HOLD_MS
  MYTHEX_WATCHDOG_STRIKES MYTHEX_HEALTH_PATH MYTHEX_HEALTHY_STATUS
  MYTHEX_SERVICES MYTHEX_COMPOSE_VARS)

TMP_FILES=()
LOCK_FD=""
LOCK_INHERITED=""
COMPOSE_CMD=()
# When set (milliseconds on now_ms's clock), no Docker call runs past it.
HOLD_DEADLINE=0
# The services wait_healthy last found not healthy.
WAIT_PENDING=""
# When set, every log line is also appended here.
LOG_FILE=""

log_line() {
  local line
  TZ=UTC printf -v line '%(%FT%TZ)T %s: %s' -1 "$SCRIPT" "$*"
  printf '%s\n' "$line"
  if [[ -n "$LOG_FILE" ]]; then
    printf '%s\n' "$line" >>"$LOG_FILE" 2>/dev/null || true
  fi
}

# A log line that cannot be written (the caller's ssh session is gone) is
# lost, never a reason to stop halfway.
err() {
  log_line "$@" >&2 2>/dev/null || log_line "$@" >/dev/null 2>&1 || true
}

log() {
  log_line "$@" 2>/dev/null || log_line "$@" >/dev/null 2>&1 || true
}

die() {
  err "$@"
  exit 1
}

# A temp file left by a failed install is removed; the file it was meant to
# replace was never touched.
cleanup_tmp() {
  local f
  for f in "${TMP_FILES[@]}"; do
    rm -rf -- "$f"
  done
}
trap cleanup_tmp EXIT
# Past a file size limit a write fails (EFBIG), like on a full disk, instead
# of killing the script between two steps.
trap '' XFSZ

# now_ms prints the wall clock in milliseconds.
now_ms() {
  local us="${EPOCHREALTIME//[!0-9]/}"
  printf '%d\n' "$((10#$us / 1000))"
}

# seconds prints milliseconds as the fractional seconds flock, sleep and
# curl take.
seconds() {
  printf '%d.%03d\n' "$(($1 / 1000))" "$(($1 % 1000))"
}

# root_problems prints why MYTHEX_ROOT cannot be used, one line each. The
# root goes into systemd's ExecStart= and into paths docker compose reads;
# spaces, | and & are fine there, quotes, backslashes and control
# characters are not.
root_problems() {
  local c
  [[ "$MYTHEX_ROOT" == /* ]] ||
    echo "MYTHEX_ROOT '$MYTHEX_ROOT' must be an absolute path (the watchdog unit runs from it)"
  if [[ "$MYTHEX_ROOT" =~ [[:cntrl:]] ]]; then
    echo "MYTHEX_ROOT must not contain control characters"
  fi
  for c in '"' "'" "\\"; do
    [[ "$MYTHEX_ROOT" != *"$c"* ]] || echo "MYTHEX_ROOT '$MYTHEX_ROOT' must not contain $c"
  done
  [[ "/$MYTHEX_ROOT/" != *"/../"* && "/$MYTHEX_ROOT/" != *"/./"* && "$MYTHEX_ROOT" != *//* ]] ||
    echo "MYTHEX_ROOT '$MYTHEX_ROOT' must be a plain path, without '.', '..' or '//'"
  [[ "$MYTHEX_ROOT" != / ]] || echo "MYTHEX_ROOT must not be /"
  [[ "$MYTHEX_PROJECT" =~ ^[a-z0-9][a-z0-9_-]*$ ]] ||
    echo "MYTHEX_PROJECT '$MYTHEX_PROJECT' must be a compose project name (lowercase letters, digits, - and _)"
  return 0
}

check_root() {
  local problems
  problems="`root_problems`"
  [[ -z "$problems" ]] || die "$problems"
}

# load_timing reads timing.env into read-only globals. It parses rather than
# sources: the file holds data, not code. Only the keys the scripts know are
# accepted: a stray MYTHEX_* line must not set the test seam or an input
# already checked. A value is read as hooks/render.go writes it: bare, or
# wholly in one pair of double quotes; any other quote is refused, never
# stripped (a stray one is a hand edit gone wrong). Every problem is
# reported at once.
load_timing() {
  local line key value problems=() n=0
  local -A seen=() refused=()
  [[ -r "$MYTHEX_TIMING_ENV" ]] || die "cannot read the timing numbers from $MYTHEX_TIMING_ENV (set MYTHEX_TIMING_ENV, or run from an installed hooks directory)"
  for key in "${TIMING_KEYS[@]}"; do
    unset "$key"
    seen["$key"]=0
  done
  while IFS= read -r line || [[ -n "$line" ]]; do
    n=$((n + 1))
    [[ -z "$line" || "$line" == \#* ]] && continue
    key="${line%%=*}"
    value="${line#*=}"
    if [[ "$line" != *=* || ! "$key" =~ ^MYTHEX_[A-Z0-9_]+$ ]]; then
      problems+=("line $n is not KEY=value: $line")
      continue
    fi
    if [[ -z "${seen[$key]+set}" ]]; then
      problems+=("line $n sets $key, which is not a timing key (known: ${TIMING_KEYS[*]})")
      continue
    fi
    if ((seen[$key])); then
      problems+=("line $n sets $key a second time")
      continue
    fi
    seen["$key"]=1
    if [[ "$value" == \"*\" ]]; then
      value="${value:1:${#value}-2}"
    fi
    if [[ "$value" == *\"* ]]; then
      problems+=("line $n sets $key to ${line#*=}: a double quote may only wrap the whole value, in one pair")
      refused["$key"]=1
      continue
    fi
    if [[ "$value" == *\'* ]]; then
      problems+=("line $n sets $key to ${line#*=}: timing.env holds no single quote (a value is bare, or in double quotes)")
      refused["$key"]=1
      continue
    fi
    printf -v "$key" '%s' "$value"
  done <"$MYTHEX_TIMING_ENV" || die "cannot read $MYTHEX_TIMING_ENV"
  for key in "${TIMING_KEYS[@]}"; do
    [[ -z "${refused[$key]:-}" ]] || continue
    if [[ -z "${!key:-}" ]]; then
      problems+=("$key is missing")
      continue
    fi
    case "$key" in
      *_MS | MYTHEX_WATCHDOG_STRIKES | MYTHEX_SETTLE_CHECKS | MYTHEX_HEALTHY_STATUS)
        [[ "${!key}" =~ ^[1-9][0-9]{0,11}$ ]] || problems+=("$key=${!key} must be a positive integer") ;;
      MYTHEX_HEALTH_PATH)
        [[ "${!key}" =~ ^/[A-Za-z0-9/._-]*$ ]] || problems+=("$key=${!key} must be a URL path") ;;
      MYTHEX_SERVICES)
        [[ "${!key}" =~ ^[a-z0-9][a-z0-9-]*( [a-z0-9][a-z0-9-]*)*$ ]] || problems+=("$key=${!key} must be service names separated by spaces") ;;
      MYTHEX_COMPOSE_VARS)
        [[ "${!key}" =~ ^MYTHEX_[A-Z0-9_]+( MYTHEX_[A-Z0-9_]+)*$ ]] || problems+=("$key=${!key} must be MYTHEX_ variable names separated by spaces") ;;
    esac
  done
  if ((${#problems[@]})); then
    err "invalid timing file $MYTHEX_TIMING_ENV:"
    printf '  %s\n' "${problems[@]}" >&2 || true
    exit 1
  fi
  for key in "${TIMING_KEYS[@]}"; do
    readonly "${key?}"
  done
}

# require_commands fails naming every command this server lacks.
require_commands() {
  local c missing=()
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || missing+=("$c")
  done
  ((${#missing[@]} == 0)) || die "missing commands: ${missing[*]} (install them first)"
}

# check_private_dir fails unless dir belongs to this user and nobody else
# may write to it: whoever can write a directory can swap the files in it.
check_private_dir() {
  local dir="$1" owner mode
  owner="`stat -c '%u' -- "$dir"`" || die "cannot stat $dir"
  mode="`stat -c '%a' -- "$dir"`" || die "cannot stat $dir"
  [[ "$owner" == "$EUID" ]] || die "$dir belongs to uid $owner, not to uid $EUID who runs $SCRIPT; refusing to use it"
  (((8#$mode & 8#022) == 0)) || die "$dir has mode $mode: group or others may write to it; run chmod go-w $dir"
}

# prepare_dirs creates the server's directories, writable by their owner
# alone, and the lock file, readable by its owner alone: flock needs only
# read access, so a lock anyone can read is a lock anyone can hold. First it
# takes group and other write out of the umask, for the rest of the run,
# whatever the caller's was (sudo and ssh pass theirs on): under umask 000 a
# directory made here would be open to everyone until its chmod, and one
# never chmodded (hook-releases, a unit directory) would stay so.
prepare_dirs() {
  local lock_dir
  umask go-w || die "cannot set the umask"
  lock_dir="`dirname -- "$MYTHEX_LOCK"`"
  mkdir -p -- "$MYTHEX_ROOT" "$STATE_DIR" "$RELEASES_DIR" "$lock_dir" || die "cannot create $MYTHEX_ROOT"
  chmod go-w -- "$MYTHEX_ROOT" "$STATE_DIR" "$RELEASES_DIR" || die "cannot tighten the modes under $MYTHEX_ROOT"
  check_private_dir "$MYTHEX_ROOT"
  check_private_dir "$STATE_DIR"
  check_private_dir "$lock_dir"
}

# open_lock opens the server lock into LOCK_FD, or takes over the hold
# remote-deploy passes down (MYTHEX_LOCK_HELD_FD).
open_lock() {
  local mode
  if [[ -n "${MYTHEX_LOCK_HELD_FD:-}" ]]; then
    check_held_fd "$MYTHEX_LOCK_HELD_FD"
    LOCK_FD="$MYTHEX_LOCK_HELD_FD"
    LOCK_INHERITED=1
    return 0
  fi
  # Created 0600 (umask 077 in a subshell): created under the caller's
  # umask and tightened after, it would be open to others in between, and
  # whoever opens it once may hold it later. Append mode: opening never
  # truncates or replaces the lock file, and it is never deleted, so every
  # process locks the same inode.
  (umask 077 && : >>"$MYTHEX_LOCK") || die "cannot create the server lock $MYTHEX_LOCK"
  exec {LOCK_FD}>>"$MYTHEX_LOCK" || die "cannot open the server lock $MYTHEX_LOCK"
  # A lock file left readable by an older release is tightened here.
  mode="`stat -c '%a' -- "$MYTHEX_LOCK"`" || die "cannot stat the server lock $MYTHEX_LOCK"
  [[ "$mode" == 600 ]] || chmod 0600 -- "$MYTHEX_LOCK" || die "cannot set the mode of $MYTHEX_LOCK to 0600"
}

# check_held_fd FD refuses an inherited descriptor unless it is open on the
# server lock and holds it: flock on the holder's own open file succeeds at
# once, so any other descriptor would let this script run without the
# server lock. The lock being free shows the descriptor does not hold it;
# held, flock -n on the descriptor succeeds only for the holder.
check_held_fd() {
  local fd="$1" probe
  [[ "$fd" =~ ^[0-9]{1,4}$ ]] ||
    die "MYTHEX_LOCK_HELD_FD '$fd' is not a descriptor number; only remote-deploy sets it, to the descriptor it holds the server lock $MYTHEX_LOCK on"
  [[ -e "/proc/self/fd/$fd" && "/proc/self/fd/$fd" -ef "$MYTHEX_LOCK" ]] ||
    die "MYTHEX_LOCK_HELD_FD $fd is not an open descriptor of the server lock $MYTHEX_LOCK"
  exec {probe}<"$MYTHEX_LOCK" || die "cannot open the server lock $MYTHEX_LOCK"
  if flock -n "$probe"; then
    exec {probe}<&-
    die "MYTHEX_LOCK_HELD_FD $fd does not hold the server lock $MYTHEX_LOCK: nobody holds it"
  fi
  exec {probe}<&-
  flock -n "$fd" ||
    die "MYTHEX_LOCK_HELD_FD $fd does not hold the server lock $MYTHEX_LOCK: another process holds it (see fuser -v $MYTHEX_LOCK)"
}

# note_holder records who holds the lock and since when, for the watchdog's
# report of a lock held too long.
note_holder() {
  write_atomic "$LOCK_HOLDER_FILE" 0644 "$$ $SCRIPT `now_ms`"$'\n' ||
    err "cannot record the lock holder in $LOCK_HOLDER_FILE (continuing)"
}

# lock_wait takes the server lock, waiting at most MYTHEX_LOCK_WAIT_MS.
lock_wait() {
  local waited
  local start
  start="`now_ms`"
  open_lock
  if ! flock -w "`seconds "$MYTHEX_LOCK_WAIT_MS"`" "$LOCK_FD"; then
    err "gave up after `seconds "$MYTHEX_LOCK_WAIT_MS"`s waiting for the server lock $MYTHEX_LOCK:" \
      "another deploy, bootstrap or watchdog restart still holds it." \
      "See who with: fuser -v $MYTHEX_LOCK; then run $SCRIPT again."
    exit "$EXIT_LOCKED"
  fi
  waited="$((`now_ms` - start))"
  note_holder
  log "holding the server lock $MYTHEX_LOCK (waited `seconds "$waited"`s)"
}

# lock_try takes the server lock if it is free; it never waits.
lock_try() {
  open_lock
  flock -n "$LOCK_FD" || return 1
  note_holder
}

unlock() {
  # An inherited hold is the holder's to release.
  [[ -z "$LOCK_INHERITED" ]] || return 0
  # Releases the lock even if a child process inherited the descriptor.
  flock -u "$LOCK_FD" || true
  exec {LOCK_FD}>&-
}

# run_critical_section is the tests' seam: with the lock held, run
# MYTHEX_CRITICAL_SECTION_CMD instead of any Docker work.
run_critical_section() {
  log "running MYTHEX_CRITICAL_SECTION_CMD instead of the Docker work"
  bash -c "$MYTHEX_CRITICAL_SECTION_CMD" "$SCRIPT"
}

# bounded MS CMD... runs CMD and kills it after MS milliseconds, or at
# HOLD_DEADLINE if that comes first: a wedged Docker engine fails the call
# instead of holding the lock forever. The Docker CLI keeps no state worth a
# clean exit (the engine does the work), hence SIGKILL. It returns 137 on a
# timeout. timeout(1) also runs CMD in a process group of its own, so a
# signal meant for the caller's group does not cut compose off halfway.
bounded() {
  local ms
  ms="`within_hold "$1"`" || {
    err "not running $2: the lock may be held no longer (bounded by the timing contract)"
    return 137
  }
  shift
  timeout -s KILL "`seconds "$ms"`" "$@"
}

# within_hold prints MS milliseconds, or fewer when HOLD_DEADLINE comes
# sooner; it fails when HOLD_DEADLINE has passed.
within_hold() {
  local ms="$1" left
  if ((HOLD_DEADLINE > 0)); then
    left=$((HOLD_DEADLINE - `now_ms`))
    ((left > 0)) || return 1
    if ((left < ms)); then
      ms="$left"
    fi
  fi
  printf '%d\n' "$ms"
}

# dq runs a quick Docker query, bounded by the start timeout: an engine that
# takes longer than a container gets to start is wedged.
dq() {
  bounded "$MYTHEX_START_TIMEOUT_MS" docker "$@"
}

# definition_grace sets GRACE_S to the stop_grace_period, in whole seconds,
# that the compose definition in directory $1 gives every service: what
# compose up --timeout stops the containers it replaces with. The contract
# has old containers stop under the new definition's grace; docker-compose
# v1 does that by itself, the compose plugin uses each old container's own
# unless told. The definition is our rendering, one line per service.
definition_grace() {
  local file="$1/$COMPOSE_NAME" line grace=""
  GRACE_S=""
  while IFS= read -r line; do
    [[ "$line" =~ ^[[:space:]]+stop_grace_period:[[:space:]]*([0-9]+)s[[:space:]]*$ ]] || continue
    if [[ -n "$grace" && "$grace" != "${BASH_REMATCH[1]}" ]]; then
      err "$file gives its services different stop_grace_periods (${grace}s, ${BASH_REMATCH[1]}s)"
      return 1
    fi
    grace="${BASH_REMATCH[1]}"
  done <"$file"
  if [[ -z "$grace" ]]; then
    err "$file gives no stop_grace_period in whole seconds"
    return 1
  fi
  GRACE_S="$grace"
}

# compose_cmd sets COMPOSE_ARGV to run docker compose (or docker-compose) on
# the release in directory $1. Its variables come from that release's
# deployed.env alone, so a deploy and a later watchdog restart interpolate
# the same values.
compose_cmd() {
  local dir="$1" v unset=()
  if ((${#COMPOSE_CMD[@]} == 0)); then
    if dq compose version >/dev/null 2>&1; then
      COMPOSE_CMD=(docker compose)
    elif command -v docker-compose >/dev/null 2>&1; then
      COMPOSE_CMD=(docker-compose)
    else
      err "neither 'docker compose' nor 'docker-compose' is installed"
      return 1
    fi
  fi
  for v in $MYTHEX_COMPOSE_VARS; do
    unset+=(-u "$v")
  done
  COMPOSE_ARGV=(env "${unset[@]}" "${COMPOSE_CMD[@]}" --env-file "$dir/$VALUES_NAME"
    -p "$MYTHEX_PROJECT" -f "$dir/$COMPOSE_NAME")
}

# container_ids prints the ids of a service's containers, running or not.
container_ids() {
  dq ps -a -q --no-trunc \
    --filter "label=com.docker.compose.project=$MYTHEX_PROJECT" \
    --filter "label=com.docker.compose.service=$1" \
    --filter "label=com.docker.compose.oneoff=False"
}

# snapshot prints "<service> <id> <status> <health> <exit code>" for every
# container of the project, from one docker ps and one docker inspect; health
# is "none" when a container has no health check. It fails when Docker does
# not answer.
snapshot() {
  local ids json
  ids="`dq ps -a -q --no-trunc \
    --filter "label=com.docker.compose.project=$MYTHEX_PROJECT" \
    --filter "label=com.docker.compose.oneoff=False"`" || {
    err "docker ps failed or timed out"
    return 1
  }
  [[ -n "$ids" ]] || return 0
  # A container removed between ps and inspect makes inspect fail; the
  # others are still printed, and what is gone is simply not there.
  # shellcheck disable=SC2086 # one id per word
  json="`dq inspect $ids 2>/dev/null`" || [[ "$json" == "["* ]] || {
    err "docker inspect failed or timed out"
    return 1
  }
  # jq, not a --format template: a container that never started has no
  # Health key, which templates refuse.
  jq -r '.[] | [.Config.Labels["com.docker.compose.service"],
    .Id, .State.Status, (.State.Health.Status // "none"), (.State.ExitCode | tostring)] | join(" ")' <<<"$json"
}

# service_problems prints "<service> <why>" for each service named in its
# arguments that is not one running, healthy container. It fails when
# Docker does not answer.
service_problems() {
  local snap svc name status health code n found
  snap="`snapshot`" || return 1
  for svc in "$@"; do
    n=0
    found=""
    while read -r name _ status health code; do
      if [[ "$name" == "$svc" ]]; then
        n=$((n + 1))
        found="$status $health $code"
      fi
    done <<<"$snap"
    if ((n == 0)); then
      echo "$svc no container"
      continue
    elif ((n > 1)); then
      echo "$svc $n containers, expected one"
      continue
    fi
    read -r status health code <<<"$found"
    if [[ "$status" != running ]]; then
      echo "$svc container not running (state $status, exit code $code)"
    elif [[ "$health" != healthy ]]; then
      echo "$svc container health is $health"
    fi
  done
}

# remove_debris removes every container of the project that is not running:
# what a killed compose leaves behind (a stopped old container, renamed or
# not; a new one created and never started). compose up then creates what
# is missing from the current release. With arguments, only those
# services' containers are looked at.
remove_debris() {
  local snap svc id status ids=()
  snap="`snapshot`" || return 1
  while read -r svc id status _; do
    [[ -n "$id" && "$status" != running ]] || continue
    (($# == 0)) || [[ " $* " == *" $svc "* ]] || continue
    log "$svc: removing container ${id:0:12} ($status), left behind by an interrupted run"
    ids+=("$id")
  done <<<"$snap"
  ((${#ids[@]} == 0)) || dq rm -f "${ids[@]}" >/dev/null || {
    err "cannot remove the containers left behind: ${ids[*]}"
    return 1
  }
}

# wait_healthy polls Docker's health status of the services named until all
# are healthy, up to MYTHEX_START_TIMEOUT_MS (or HOLD_DEADLINE). On failure
# WAIT_PENDING names the services not known healthy: those of Docker's last
# answer, all of them if it never answered.
wait_healthy() {
  local deadline problems pending="$*" answered=0 silent name
  deadline="$((`now_ms` + MYTHEX_START_TIMEOUT_MS))"
  if ((HOLD_DEADLINE > 0 && HOLD_DEADLINE < deadline)); then
    deadline="$HOLD_DEADLINE"
  fi
  while :; do
    if problems="`service_problems "$@"`"; then
      answered=1
      # No command here: one that failed would leave nothing pending.
      pending=""
      while read -r name _; do
        [[ -z "$name" ]] || pending+="$name "
      done <<<"$problems"
      pending="${pending% }"
      [[ -n "$pending" ]] || return 0
    else
      answered=0
    fi
    if ((`now_ms` >= deadline)); then
      WAIT_PENDING="$pending"
      ((answered)) && silent="" || silent=" (Docker did not answer the last check)"
      err "not healthy after `seconds "$MYTHEX_START_TIMEOUT_MS"`s: $pending$silent"
      return 1
    fi
    sleep "`seconds "$MYTHEX_CONTAINER_HEALTH_INTERVAL_MS"`" || return 1
  done
}

# endpoint prints host:port where a container's service is published.
endpoint() {
  local line addr host
  line="`dq port "$1" 2>/dev/null | head -n 1`" || return 1
  [[ -n "$line" ]] || return 1
  addr="${line##* -> }"
  host="${addr%:*}"
  case "$host" in
    0.0.0.0 | "[::]" | "::" | "") host=127.0.0.1 ;;
  esac
  printf '%s:%s\n' "$host" "${addr##*:}"
}

# verify_service prints one line per thing wrong with a service: its
# container, its health answer, or its /about role and version. It prints
# nothing when the service is right.
# health_code EP MAX_TIME prints the status the service at EP answers on its
# health path (000 when it does not answer). The request says it is the
# server's own (SELF_CHECK_HEADER): the evidence drain counts every other
# checker as a balancer node that must fail its checks before the drain can
# end early, and a deploy's or the watchdog's one-off check would be a node
# that never checks again, holding every drain in its window to the fixed
# length.
health_code() {
  curl -s -o /dev/null -w '%{http_code}' -H "$SELF_CHECK_HEADER: 1" --max-time "$2" "http://$1$MYTHEX_HEALTH_PATH" || true
}

verify_service() {
  local svc="$1" version="$2" problem id ep code about role got_version
  local max_time about_path="/about"
  # A run whose lock hold is bounded (the watchdog: HOLD_DEADLINE) asks
  # nothing past it, and each request only for what is left of it.
  if ! max_time="`http_max_time`"; then
    echo "$svc: not verified: the lock may be held no longer (bounded by the timing contract)"
    return 0
  fi
  if ! problem="`service_problems "$svc"`"; then
    echo "$svc: Docker did not answer"
    return 0
  fi
  problem="${problem#"$svc" }"
  if [[ -n "$problem" ]]; then
    echo "$svc: $problem"
    # A running container that fails its health check may still answer.
    [[ "$problem" == "container health is"* ]] || return 0
  fi
  if ! id="`container_ids "$svc"`" || ! ep="`endpoint "$id"`"; then
    echo "$svc: no published port"
    return 0
  fi
  if ! max_time="`http_max_time`"; then
    echo "$svc: not verified: the lock may be held no longer (bounded by the timing contract)"
    return 0
  fi
  code="`health_code "$ep" "$max_time"`"
  [[ "$code" == "$MYTHEX_HEALTHY_STATUS" ]] ||
    echo "$svc: $MYTHEX_HEALTH_PATH at $ep answered ${code:-nothing}, not $MYTHEX_HEALTHY_STATUS"
  if ! max_time="`http_max_time`"; then
    echo "$svc: not verified: the lock may be held no longer (bounded by the timing contract)"
    return 0
  fi
  if ! about="`curl -fsS --max-time "$max_time" "http://$ep$about_path" 2>&1`"; then
    echo "$svc: $about_path at $ep failed: $about"
    return 0
  fi
  if ! role="`jq -r '.role // "" | tostring' <<<"$about" 2>/dev/null`" ||
    ! got_version="`jq -r '.version // "" | tostring' <<<"$about" 2>/dev/null`"; then
    echo "$svc: $about_path at $ep is not JSON: $about"
    return 0
  fi
  [[ "$role" == "$svc" ]] || echo "$svc: $about_path at $ep says role '$role'"
  [[ "$got_version" == "$version" ]] || echo "$svc: $about_path at $ep says version '$got_version', not '$version'"
}

# http_max_time prints the seconds one verification request may take: the
# container health check's timeout, or what is left of HOLD_DEADLINE when
# that comes sooner. It fails when HOLD_DEADLINE has passed.
http_max_time() {
  local ms
  ms="`within_hold "$MYTHEX_CONTAINER_HEALTH_TIMEOUT_MS"`" || return 1
  seconds "$ms"
}

# verify_all prints every problem of every service, or nothing. A later
# release's remote-deploy sources the lib.sh of the hooks that deployed a
# release and runs load_timing and verify_all VERSION to judge it by its
# own numbers: both keep their names and what they do.
verify_all() {
  local version="$1" svc
  for svc in $MYTHEX_SERVICES; do
    verify_service "$svc" "$version"
  done
}

# write_atomic DST MODE CONTENT replaces DST with CONTENT in one rename, from
# a temp file in the same directory, so no reader ever sees half a file. A
# failed write (disk full) leaves DST as it was and fails.
write_atomic() {
  local dst="$1" mode="$2" content="$3" tmp
  tmp=`dirname -- "$dst"`
  tmp=`mktemp "$tmp/.${dst##*/}.XXXXXX"` || {
    err "cannot create a temp file beside $dst; it is unchanged"
    return 1
  }
  TMP_FILES+=("$tmp")
  if ! printf '%s' "$content" >"$tmp" || ! chmod "$mode" -- "$tmp" || ! mv -f -- "$tmp" "$dst"; then
    rm -f -- "$tmp"
    err "cannot write $dst (disk full?); it is unchanged"
    return 1
  fi
}

# copy_atomic SRC DST MODE is write_atomic with SRC's bytes.
copy_atomic() {
  local src="$1" dst="$2" mode="$3" tmp
  tmp=`dirname -- "$dst"`
  tmp=`mktemp "$tmp/.${dst##*/}.XXXXXX"` || {
    err "cannot create a temp file beside $dst; it is unchanged"
    return 1
  }
  TMP_FILES+=("$tmp")
  if ! cat -- "$src" >"$tmp" || ! chmod "$mode" -- "$tmp" || ! mv -f -- "$tmp" "$dst"; then
    rm -f -- "$tmp"
    err "cannot copy $src to $dst (disk full?); it is unchanged"
    return 1
  fi
}

# switch_link LINK TARGET points the symlink LINK at TARGET with one rename.
switch_link() {
  local link="$1" target="$2" tmp
  tmp="`dirname -- "$link"`/.${link##*/}.$$.link"
  rm -f -- "$tmp" || return 1
  TMP_FILES+=("$tmp")
  if ! ln -s -- "$target" "$tmp" || ! mv -fT -- "$tmp" "$link"; then
    rm -f -- "$tmp"
    err "cannot point $link at $target; it is unchanged"
    return 1
  fi
}

# checksum_ok DIR checks DIR's compose.yaml against the checksum beside it.
checksum_ok() {
  local dir="$1" want got
  [[ -r "$dir/$COMPOSE_NAME" && -r "$dir/$CHECKSUM_NAME" ]] || return 1
  read -r want _ <"$dir/$CHECKSUM_NAME" || return 1
  got="`sha256sum <"$dir/$COMPOSE_NAME"`" || return 1
  [[ "${got%% *}" == "$want" ]]
}

# hooks_sum DIR prints the SHA-256 of the hooks in DIR, all of them in one
# order; it fails when one is missing.
hooks_sum() {
  local sum entry files=()
  for entry in "${HOOK_FILES[@]}"; do
    files+=("${entry%% *}")
  done
  sum=`cd -- "$1" && cat -- "${files[@]}" | sha256sum` || return 1
  printf '%s\n' "${sum%% *}"
}

# installed_hooks prints which hooks are installed (hook-releases/<id>, what
# the hooks link names), or nothing when bootstrap never linked them.
installed_hooks() {
  local target
  target="`readlink -- "$HOOKS_LINK" 2>/dev/null`" || return 0
  if [[ "$target" =~ ^hook-releases/[0-9a-f]{16}$ ]]; then
    printf '%s\n' "$target"
  fi
}

# hooks_whole REF succeeds when REF (hook-releases/<id>) names a hooks
# directory that holds every hook file, unchanged since it was installed:
# its contents hash to its name.
hooks_whole() {
  local ref="$1" sum
  [[ "$ref" =~ ^hook-releases/[0-9a-f]{16}$ ]] || return 1
  sum="`hooks_sum "$MYTHEX_ROOT/$ref" 2>/dev/null`" || return 1
  [[ "${sum:0:16}" == "${ref#hook-releases/}" ]]
}

# published_checksum prints the checksum published with the release in
# MYTHEX_RELEASE_DIR, after checking that its compose.yaml matches it.
published_checksum() {
  local src="$MYTHEX_RELEASE_DIR/$COMPOSE_NAME" sum_file="$MYTHEX_RELEASE_DIR/$CHECKSUM_NAME"
  local want got
  [[ -r "$src" ]] || die "no compose definition at $src; nothing installed"
  [[ -r "$sum_file" ]] || die "no published checksum at $sum_file; refusing $src, nothing installed"
  read -r want _ <"$sum_file" || true
  [[ "$want" =~ ^[0-9a-f]{64}$ ]] || die "$sum_file holds no SHA-256; refusing $src, nothing installed"
  got="`sha256sum <"$src"`" || die "cannot read $src"
  got="${got%% *}"
  if [[ "$got" != "$want" ]]; then
    die "refusing $src: its SHA-256 is $got but the published checksum is $want;" \
      "the installed release is unchanged. Publish compose.yaml and its checksum together."
  fi
  printf '%s\n' "$want"
}

# current_version prints the version the current release runs.
current_version() {
  release_version "$CURRENT"
}

# release_version DIR prints the version the release in DIR runs.
release_version() {
  local line
  [[ -r "$1/$VALUES_NAME" ]] || return 1
  while IFS= read -r line; do
    if [[ "$line" == MYTHEX_VERSION=* ]]; then
      printf '%s\n' "${line#MYTHEX_VERSION=}"
      return 0
    fi
  done <"$1/$VALUES_NAME"
  return 1
}

# release_ok DIR succeeds when DIR holds a whole release: its definition
# matching its checksum, and values that name its version.
release_ok() {
  checksum_ok "$1" && release_version "$1" >/dev/null
}

# linked_previous prints the name of the release `previous` names, when it
# is whole and runs another version than `current`; it fails otherwise (no
# link, or one a deploy by hooks older than it left behind: those neither
# move nor keep it).
linked_previous() {
  local target version now=""
  target="`readlink -- "$PREVIOUS" 2>/dev/null`" || return 1
  [[ "$target" =~ ^releases/[^./][^/]*$ ]] || return 1
  release_ok "$MYTHEX_ROOT/$target" || return 1
  version="`release_version "$MYTHEX_ROOT/$target"`" || return 1
  now="`current_version 2>/dev/null`" || now=""
  [[ "$version" != "$now" ]] || return 1
  printf '%s\n' "${target#releases/}"
}

# previous_release prints the name of the release the server ran before
# the current one (linked_previous), or nothing. A server whose releases
# predate the link names none until a deploy of another version: which of
# its kept releases ran before cannot be told from a release staged by a
# deploy that failed before switching, which never ran.
previous_release() {
  linked_previous || true
}

# hooks_in_use REF succeeds when a release kept on the server records REF
# (hook-releases/<id>) as the hooks that deployed it: a rollback to that
# release runs them again, so they are kept as long as it is.
hooks_in_use() {
  local ref="$1" dir got
  for dir in "$RELEASES_DIR"/*; do
    [[ -r "$dir/$HOOKS_REF_NAME" ]] || continue
    got="`<"$dir/$HOOKS_REF_NAME"`" || continue
    [[ "$got" != "$ref" ]] || return 0
  done
  return 1
}

# remove_leftovers removes the temp files and staging directories a killed
# run left behind (every name starting with a dot under the root, state/ and
# releases/). Only a lock holder calls it: no other run is writing them.
remove_leftovers() {
  local f
  for f in "$MYTHEX_ROOT"/.[!.]* "$STATE_DIR"/.[!.]* "$RELEASES_DIR"/.[!.]*; do
    [[ -e "$f" || -L "$f" ]] || continue
    # The watchdog writes lock-busy without the lock (it found it held).
    [[ "$f" != "$STATE_DIR/.${LOCK_BUSY_FILE##*/}."* ]] || continue
    rm -rf -- "$f" || err "cannot remove $f, left behind by an interrupted run"
  done
}

# reset_strikes zeroes every service's watchdog strikes.
reset_strikes() {
  local svc content=""
  for svc in $MYTHEX_SERVICES; do
    content+="$svc 0"$'\n'
  done
  write_atomic "$STRIKES_FILE" 0644 "$content"
}

# The containers a watchdog run replaces when it finishes an interrupted
# deploy are judged as deploy judges the ones it replaces: each must exit 0
# (its drain fit inside stop_grace_period) and cut no request at its
# shutdown timeout. Compose removes a container once it has stopped it, so
# its exit code and log are recorded while compose runs. (deploy has its
# own copy of this, which replaces every container.)
WATCH_PIDS=()
# Set by check_replaced: one line per problem.
REPLACED_PROBLEMS=()

# watch_replaced DIR records in DIR, in the background, for every running
# container of the project, its exit code (DIR/<service>.<id>) and its log
# from now on (.log), with docker logs' exit status (.log-exit): a log
# Docker cannot read must not pass for one without cut requests. Every
# watcher ends at the lock-hold bound; none inherits the lock.
watch_replaced() {
  local dir="$1" snap svc id status since ms
  since="`date +%s`" || return 1
  snap="`snapshot`" || return 1
  ms="`within_hold "$MYTHEX_WATCHDOG_HOLD_MS"`" || return 1
  while read -r svc id status _; do
    [[ -n "$id" && "$status" == running ]] || continue
    # timeout itself in the background, not in a subshell, so that
    # stop_watching's SIGTERM reaches it, and it passes it on.
    timeout -s KILL "`seconds "$ms"`" docker wait "$id" >"$dir/$svc.${id:0:12}" 2>/dev/null {LOCK_FD}>&- &
    WATCH_PIDS+=("$!")
    record_log "$id" "$dir/$svc.${id:0:12}" "$since" "$ms" {LOCK_FD}>&- &
    WATCH_PIDS+=("$!")
  done <<<"$snap"
}

# record_log ID RECORD SINCE MS (run in the background) copies the
# container's log into RECORD.log until it stops, then docker logs' status
# into RECORD.log-exit. Stopped first, it stops docker logs and records
# nothing.
record_log() {
  local child status=0
  timeout -s KILL "`seconds "$4"`" docker logs --follow --since "$3" "$1" >"$2.log" 2>&1 &
  child=$!
  # shellcheck disable=SC2064 # the child's pid, now
  trap "kill $child 2>/dev/null; exit 1" TERM
  wait "$child" || status=$?
  printf '%s\n' "$status" >"$2.log-exit"
}

# stop_watching ends the watchers still running: each watches a container
# that was not stopped.
stop_watching() {
  local pid
  for pid in "${WATCH_PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  WATCH_PIDS=()
}

# check_replaced DIR logs how each watched container ended and sets
# REPLACED_PROBLEMS: one that did not exit 0, every request one cut at its
# shutdown timeout, and one whose log could not be read to tell. A
# container that was not stopped (compose kept it: it already ran the
# current release) is no problem.
check_replaced() {
  local dir="$1" f name svc id code cut
  REPLACED_PROBLEMS=()
  for f in "$dir"/*; do
    [[ -e "$f" && "$f" != *.log && "$f" != *.log-exit ]] || continue
    name="${f##*/}"
    svc="${name%%.*}"
    id="${name#*.}"
    code="`cat -- "$f"`" || code=""
    case "$code" in
      "")
        log "$svc: container $id kept (it runs the current release)"
        continue
        ;;
      0) log "$svc: old container $id drained and exited 0" ;;
      137) REPLACED_PROBLEMS+=("$svc: old container $id exited 137: killed after stop_grace_period `seconds "$MYTHEX_STOP_GRACE_PERIOD_MS"`s, before its drain finished") ;;
      *) REPLACED_PROBLEMS+=("$svc: old container $id exited $code, not 0") ;;
    esac
    if ! cut="`cut_lines "$f"`"; then
      REPLACED_PROBLEMS+=("$svc: old container $id exited $code but its log could not be read: cannot tell whether it cut requests ($cut)")
    elif [[ -n "$cut" ]]; then
      REPLACED_PROBLEMS+=("$svc: old container $id cut `wc -l <<<"$cut"` request(s) at its shutdown timeout: `tr '\n' ',' <<<"$cut" | sed 's/,$//; s/,/, /g'`")
    fi
  done
}

# cut_lines RECORD prints "METHOD PATH" for each request the drain library
# logged as cut at its shutdown timeout in RECORD.log. When that log was
# not read to its end, nobody can tell: it prints why and fails.
cut_lines() {
  local record="$1" status cut
  if [[ ! -r "$record.log-exit" ]] || ! status="`cat -- "$record.log-exit"`"; then
    echo "docker logs did not finish"
    return 1
  fi
  if [[ "$status" != 0 ]]; then
    echo "docker logs exited $status: `head -n 1 -- "$record.log" 2>/dev/null`"
    return 1
  fi
  cut="`jq -R -r 'fromjson? | select(.msg == "request cut at shutdown timeout" or .msg == "hijacked connection cut at shutdown timeout")
    | "\(.method) \(.path)"' <"$record.log"`" || {
    echo "cannot read $record.log"
    return 1
  }
  [[ -z "$cut" ]] || printf '%s\n' "$cut"
}
