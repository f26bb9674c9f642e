#!/bin/sh
# Builds every WASM provider plugin under plugins/src/NAME/ into
# plugins/NAME.wasm (or into the directory given as $1), with the machine's
# Go toolchain. The modules are build products: they are not committed.
#
#   plugins/build.sh            # -> plugins/*.wasm
#   plugins/build.sh /tmp/out   # -> /tmp/out/*.wasm
set -eu

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
go=${GO:-go}
mkdir -p "$out"

status=0
for dir in "$here"/src/*/; do
	name=$(basename "$dir")
	[ -f "$dir/main.go" ] || continue
	if (cd "$dir" && GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 "$go" build -buildmode=c-shared -trimpath -o "$out/$name.wasm" .); then
		echo "built $out/$name.wasm"
	else
		echo "failed: $name" >&2
		status=1
	fi
done
exit $status
