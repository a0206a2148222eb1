# Shared by the rxe-vm scripts (sourced).
die() {
    echo "rxe-vm: $*" >&2
    exit 1
}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${RXE_VM_WORK:-$("$repo/tools/target-dir")/rxe-vm}
