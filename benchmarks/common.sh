# Shared by the benchmark scripts; sourced after their arguments are read,
# with $root (the repository), $build (the build folder asked for, may be
# empty), $cells and $py set.

# Makes $build absolute (a relative one is taken from where the script was
# called), moves to the repository root so that printed tables name no
# folder of this machine, and defaults $build to $1.  Sets $data.
bench_enter_root() {
    case "$build" in
        ""|/*) ;;
        *) build="$(pwd)/$build" ;;
    esac
    cd "$root"
    [ -n "$build" ] || build=$1
    data=benchmarks/data
    mkdir -p "$data"
}

# Generates the synthetic atlas of $cells cells as $1 (IVCSR), and its
# standard CSR copy as $2 when given, unless they exist already.
bench_ensure_atlas() {
    local iv=$1 csr=${2:-}
    if [ ! -f "$iv" ] || { [ -n "$csr" ] && [ ! -f "$csr" ]; }; then
        echo "generating $iv${csr:+ and $csr}" >&2
        "$py" benchmarks/gen_atlas.py --cells "$cells" -o "$iv" ${csr:+--csr-h5ad "$csr"} >&2
    fi
}
