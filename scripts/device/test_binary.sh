# Sourced by the gpu_*_stage.sh scripts: test_binary NAME prints the path of the
# integration test binary NAME (harness = false GPU tests) that cargo builds with the
# caller's FEATURES array, without running it.
test_binary() {
    cargo test "${FEATURES[@]}" --test "$1" --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$1"
}
