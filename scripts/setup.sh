#!/usr/bin/env bash
# Installs the Debian packages llmem needs (only the missing ones), then
# configures and builds llmem into build/.
#
#   ./scripts/setup.sh            install + configure + build
#
# Other scripts source this file and call llmem_setup. Environment:
#   LLMEM_BUILD_DIR    build folder (default: build/ in the repository)
#   LLMEM_CMAKE_ARGS   extra arguments for the cmake configure step
#   CI                 when set (to anything), warnings are errors (-DLLMEM_WERROR=ON)
#
# Needs root or sudo only when a package is missing; a second run installs
# nothing and does not call apt-get at all.

LLMEM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLMEM_BUILD="${LLMEM_BUILD_DIR:-$LLMEM_ROOT/build}"

LLMEM_PACKAGES=(
  build-essential cmake pkg-config
  check libsubunit-dev libcjson-dev libxxhash-dev libpcre2-dev libutf8proc-dev
  libmicrohttpd-dev
  libvulkan-dev libvulkan-volk-dev glslang-tools mesa-vulkan-drivers vulkan-validationlayers
  spirv-tools
  clang libclang-rt-14-dev
  python3 python3-venv
)

llmem_log() { printf '[llmem] %s\n' "$*" >&2; }

llmem_package_installed() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

llmem_install_packages() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    llmem_log "dpkg-query not found: not a Debian system; install the equivalents of: ${LLMEM_PACKAGES[*]}"
    return 0
  fi
  local missing=() p
  for p in "${LLMEM_PACKAGES[@]}"; do
    llmem_package_installed "$p" || missing+=("$p")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    llmem_log "all ${#LLMEM_PACKAGES[@]} packages already installed"
    return 0
  fi
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      llmem_log "missing packages: ${missing[*]}; run as root or install sudo"
      return 1
    fi
    sudo=(sudo)
  fi
  llmem_log "installing: ${missing[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q || return 1
  # Packages this release does not know (e.g. another clang version) are
  # skipped with a warning; the build checks what it really needs.
  local known=()
  for p in "${missing[@]}"; do
    if apt-cache show "$p" >/dev/null 2>&1; then
      known+=("$p")
    else
      llmem_log "warning: package $p is not available here; skipping it"
    fi
  done
  [ "${#known[@]}" -eq 0 ] && return 0
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${known[@]}"
}

llmem_jobs() { nproc 2>/dev/null || echo 2; }

llmem_build() {
  local args=(-S "$LLMEM_ROOT" -B "$LLMEM_BUILD")
  if [ ! -f "$LLMEM_BUILD/CMakeCache.txt" ]; then
    args+=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
  fi
  if [ -n "${CI:-}" ]; then
    args+=(-DLLMEM_WERROR=ON)
  fi
  # shellcheck disable=SC2206 # word splitting of the extra arguments is wanted
  args+=(${LLMEM_CMAKE_ARGS:-})
  llmem_log "configuring $LLMEM_BUILD"
  cmake "${args[@]}" || return 1
  llmem_log "building with $(llmem_jobs) jobs"
  cmake --build "$LLMEM_BUILD" -j "$(llmem_jobs)"
}

llmem_setup() {
  llmem_install_packages || { llmem_log "package installation failed"; return 1; }
  llmem_build || { llmem_log "build failed"; return 1; }
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  llmem_setup
fi
