#!/usr/bin/env bash
# Installs what is missing, builds llmem into build/, then runs every test
# with ctest. Vulkan tests run on Mesa's lavapipe (a CPU Vulkan driver) with
# the Khronos validation layer enabled.
#
#   ./scripts/test.sh [extra ctest arguments, e.g. -L core]
#
# Exits non-zero when the set-up, the build or any test fails.
set -euo pipefail
# shellcheck source=scripts/setup.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
llmem_setup

# Every lavapipe ICD file (one per architecture) goes on the driver list.
lvp_icds=""
for f in /usr/share/vulkan/icd.d/lvp_icd*.json; do
  [ -e "$f" ] && lvp_icds="${lvp_icds:+$lvp_icds:}$f"
done
if [ -n "$lvp_icds" ]; then
  export VK_DRIVER_FILES="$lvp_icds"  # Vulkan loader >= 1.3.234
  export VK_ICD_FILENAMES="$lvp_icds" # older loaders
  llmem_log "Vulkan driver: $lvp_icds"
else
  llmem_log "warning: lavapipe (mesa-vulkan-drivers) not found; Vulkan tests use the system driver"
fi
export VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation

ctest --test-dir "$LLMEM_BUILD" --output-on-failure -j2 --timeout 600 "$@"
