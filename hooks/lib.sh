#!/usr/bin/env bash
# Shared by deploy, bootstrap and watchdog: the server layout, logging, the
# one server lock, the numbers generated from the timing contract, compose,
# and atomic installs. Sourced, never run.
#
# Settings (production defaults; the tests and the rehearsal set them per
# simulated server):
#   MYTHEX_ROOT        server directory: installed compose.yaml, state/, lock
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
#                      the lock instead of the script's work

readonly SCRIPT="${0##*/}"
HOOKS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HOOKS_DIR
readonly MYTHEX_ROOT="${MYTHEX_ROOT:-/opt/mythex}"
readonly MYTHEX_LOCK="${MYTHEX_LOCK:-$MYTHEX_ROOT/mythex.lock}"
readonly MYTHEX_PROJECT="${MYTHEX_PROJECT:-mythex}"
readonly MYTHEX_TIMING_ENV="${MYTHEX_TIMING_ENV:-$HOOKS_DIR/timing.env}"
readonly MYTHEX_RELEASE_DIR="${MYTHEX_RELEASE_DIR:-$HOOKS_DIR}"
readonly INSTALLED_COMPOSE="$MYTHEX_ROOT/compose.yaml"
readonly INSTALLED_CHECKSUM="$MYTHEX_ROOT/compose.yaml.sha256"
readonly STATE_DIR="$MYTHEX_ROOT/state"
readonly DEPLOYED_ENV="$STATE_DIR/deployed.env"
readonly STRIKES_FILE="$STATE_DIR/strikes"
# Exit status when the lock stays held past the bound (EX_TEMPFAIL): the
# caller may retry later.
readonly EXIT_LOCKED=75
# The keys timing.env must define; durations end in _MS.
readonly TIMING_KEYS=(MYTHEX_LOCK_WAIT_MS MYTHEX_START_TIMEOUT_MS
  MYTHEX_STOP_GRACE_PERIOD_MS MYTHEX_CONTAINER_HEALTH_INTERVAL_MS
  MYTHEX_CONTAINER_HEALTH_TIMEOUT_MS MYTHEX_SETTLE_MS MYTHEX_REENTRY_POLL_MS
  MYTHEX_REENTRY_WAIT_MS MYTHEX_WATCHDOG_INTERVAL_MS
  MYTHEX_WATCHDOG_STRIKES MYTHEX_HEALTH_PATH MYTHEX_HEALTHY_STATUS
  MYTHEX_SERVICES MYTHEX_COMPOSE_VARS)

TMP_FILES=()
LOCK_FD=""
LOCK_INHERITED=""
COMPOSE_CMD=()

err() {
  printf '%s %s: %s\n' "$(date -u +%FT%TZ)" "$SCRIPT" "$*" >&2
}

log() {
  printf '%s %s: %s\n' "$(date -u +%FT%TZ)" "$SCRIPT" "$*"
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
    rm -f -- "$f"
  done
}
trap cleanup_tmp EXIT

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

# load_timing reads timing.env into read-only globals. It parses rather than
# sources: the file holds data, not code. Every problem is reported at once.
load_timing() {
  local line key value problems=() n=0
  [[ -r "$MYTHEX_TIMING_ENV" ]] || die "cannot read the timing numbers from $MYTHEX_TIMING_ENV (set MYTHEX_TIMING_ENV, or run from an installed hooks directory)"
  while IFS= read -r line || [[ -n "$line" ]]; do
    n=$((n + 1))
    [[ -z "$line" || "$line" == \#* ]] && continue
    key="${line%%=*}"
    value="${line#*=}"
    if [[ "$line" != *=* || ! "$key" =~ ^MYTHEX_[A-Z0-9_]+$ ]]; then
      problems+=("line $n is not KEY=value: $line")
      continue
    fi
    value="${value#\"}"
    value="${value%\"}"
    printf -v "$key" '%s' "$value"
  done <"$MYTHEX_TIMING_ENV"
  for key in "${TIMING_KEYS[@]}"; do
    if [[ -z "${!key:-}" ]]; then
      problems+=("$key is missing")
    elif [[ "$key" == *_MS || "$key" == MYTHEX_WATCHDOG_STRIKES || "$key" == MYTHEX_HEALTHY_STATUS ]] &&
      ! [[ "${!key}" =~ ^[1-9][0-9]*$ ]]; then
      problems+=("$key=${!key} must be a positive integer")
    fi
  done
  if ((${#problems[@]})); then
    err "invalid timing file $MYTHEX_TIMING_ENV:"
    printf '  %s\n' "${problems[@]}" >&2
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

prepare_dirs() {
  mkdir -p -- "$MYTHEX_ROOT" "$STATE_DIR" "$(dirname -- "$MYTHEX_LOCK")"
}

open_lock() {
  if [[ -n "${MYTHEX_LOCK_HELD_FD:-}" ]]; then
    # flock on the holder's own open file succeeds at once; any other file
    # would let this script run without the server lock.
    [[ "$MYTHEX_LOCK_HELD_FD" =~ ^[0-9]+$ && "/proc/self/fd/$MYTHEX_LOCK_HELD_FD" -ef "$MYTHEX_LOCK" ]] ||
      die "MYTHEX_LOCK_HELD_FD '$MYTHEX_LOCK_HELD_FD' is not an open descriptor of the server lock $MYTHEX_LOCK"
    LOCK_FD="$MYTHEX_LOCK_HELD_FD"
    LOCK_INHERITED=1
    return 0
  fi
  # Append mode: opening never truncates or replaces the lock file, and it is
  # never deleted, so every process locks the same inode.
  exec {LOCK_FD}>>"$MYTHEX_LOCK"
}

# lock_wait takes the server lock, waiting at most MYTHEX_LOCK_WAIT_MS.
lock_wait() {
  local waited
  local start
  start="$(now_ms)"
  open_lock
  if ! flock -w "$(seconds "$MYTHEX_LOCK_WAIT_MS")" "$LOCK_FD"; then
    err "gave up after $(seconds "$MYTHEX_LOCK_WAIT_MS")s waiting for the server lock $MYTHEX_LOCK:" \
      "another deploy, bootstrap or watchdog restart still holds it." \
      "See who with: fuser -v $MYTHEX_LOCK; then run $SCRIPT again."
    exit "$EXIT_LOCKED"
  fi
  waited="$(($(now_ms) - start))"
  log "holding the server lock $MYTHEX_LOCK (waited $(seconds "$waited")s)"
}

# lock_try takes the server lock if it is free; it never waits.
lock_try() {
  open_lock
  flock -n "$LOCK_FD"
}

unlock() {
  # An inherited hold is the holder's to release.
  [[ -z "$LOCK_INHERITED" ]] || return 0
  # Releases the lock even if a child process inherited the descriptor.
  flock -u "$LOCK_FD"
  exec {LOCK_FD}>&-
}

# run_critical_section is the tests' seam: with the lock held, run
# MYTHEX_CRITICAL_SECTION_CMD instead of any Docker work.
run_critical_section() {
  log "running MYTHEX_CRITICAL_SECTION_CMD instead of the Docker work"
  bash -c "$MYTHEX_CRITICAL_SECTION_CMD" "$SCRIPT"
}

# compose runs docker compose (or docker-compose) on the installed
# definition. Its variables come from state/deployed.env alone, so a deploy
# and a later watchdog restart interpolate the same values.
compose() {
  local v unset=()
  if ((${#COMPOSE_CMD[@]} == 0)); then
    if docker compose version >/dev/null 2>&1; then
      COMPOSE_CMD=(docker compose)
    elif command -v docker-compose >/dev/null 2>&1; then
      COMPOSE_CMD=(docker-compose)
    else
      die "neither 'docker compose' nor 'docker-compose' is installed"
    fi
  fi
  for v in $MYTHEX_COMPOSE_VARS; do
    unset+=(-u "$v")
  done
  env "${unset[@]}" "${COMPOSE_CMD[@]}" --env-file "$DEPLOYED_ENV" \
    -p "$MYTHEX_PROJECT" -f "$INSTALLED_COMPOSE" "$@"
}

# container_ids prints the ids of a service's containers, running or not.
container_ids() {
  docker ps -a -q --no-trunc \
    --filter "label=com.docker.compose.project=$MYTHEX_PROJECT" \
    --filter "label=com.docker.compose.service=$1" \
    --filter "label=com.docker.compose.oneoff=False"
}

# snapshot prints "<service> <id> <status> <health> <exit code>" for every
# container of the project, from one docker ps and one docker inspect; health
# is "none" when a container has no health check.
snapshot() {
  local ids
  ids="$(docker ps -a -q --no-trunc \
    --filter "label=com.docker.compose.project=$MYTHEX_PROJECT" \
    --filter "label=com.docker.compose.oneoff=False")"
  [[ -n "$ids" ]] || return 0
  # jq, not a --format template: a container that never started has no
  # Health key, which templates refuse.
  # shellcheck disable=SC2086 # one id per word
  docker inspect $ids 2>/dev/null | jq -r '.[] | [.Config.Labels["com.docker.compose.service"],
    .Id, .State.Status, (.State.Health.Status // "none"), (.State.ExitCode | tostring)] | join(" ")' || true
}

# service_problems prints "<service> <why>" for each service named in its
# arguments that is not one running, healthy container.
service_problems() {
  local snap svc name status health code n found
  snap="$(snapshot)"
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

# write_atomic replaces $1 with stdin in one rename, from a temp file in
# the same directory, so no reader ever sees half a file.
write_atomic() {
  local dst="$1" mode="${2:-0644}" tmp
  tmp="$(mktemp "$(dirname -- "$dst")/.${dst##*/}.XXXXXX")"
  TMP_FILES+=("$tmp")
  cat >"$tmp"
  chmod "$mode" "$tmp"
  mv -f -- "$tmp" "$dst"
}

# install_compose installs the release's compose.yaml only if its SHA-256
# matches the published checksum; otherwise the installed file stays as it was.
install_compose() {
  local src="$MYTHEX_RELEASE_DIR/compose.yaml" sum_file="$MYTHEX_RELEASE_DIR/compose.yaml.sha256"
  local want got tmp
  [[ -r "$src" ]] || die "no compose definition at $src; nothing installed"
  [[ -r "$sum_file" ]] || die "no published checksum at $sum_file; refusing $src, nothing installed"
  read -r want _ <"$sum_file" || true
  [[ "$want" =~ ^[0-9a-f]{64}$ ]] || die "$sum_file holds no SHA-256; refusing $src, nothing installed"
  # Hash the copy, not the source: what is checked is what gets installed.
  tmp="$(mktemp "$MYTHEX_ROOT/.compose.yaml.XXXXXX")"
  TMP_FILES+=("$tmp")
  cp -- "$src" "$tmp"
  got="$(sha256sum <"$tmp")"
  got="${got%% *}"
  if [[ "$got" != "$want" ]]; then
    die "refusing $src: its SHA-256 is $got but the published checksum is $want;" \
      "the installed $INSTALLED_COMPOSE is unchanged. Publish compose.yaml and its checksum together."
  fi
  chmod 0444 "$tmp"
  mv -f -- "$tmp" "$INSTALLED_COMPOSE"
  printf '%s  compose.yaml\n' "$want" | write_atomic "$INSTALLED_CHECKSUM" 0444
  log "installed compose definition $want"
}

# installed_compose_intact checks the installed definition against the
# checksum installed with it.
installed_compose_intact() {
  local want got
  [[ -r "$INSTALLED_COMPOSE" && -r "$INSTALLED_CHECKSUM" ]] || return 1
  read -r want _ <"$INSTALLED_CHECKSUM" || return 1
  got="$(sha256sum <"$INSTALLED_COMPOSE")"
  [[ "${got%% *}" == "$want" ]]
}

# reset_strikes zeroes every service's watchdog strikes.
reset_strikes() {
  local svc
  for svc in $MYTHEX_SERVICES; do
    printf '%s 0\n' "$svc"
  done | write_atomic "$STRIKES_FILE"
}
