# call 3 (2026-12-05, twenty-third session, H200): long_ctx at 32K twice more each (call 2 read
# 2.937x tokens/s against the seventeenth session's 3.039x), and the step's kernels by nsys
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
for r in 1 2; do for pol in full qevict; do
  timeout 100 long_ctx --policy $pol --budget 0.2 --ctx 32768 --new 200 > $R/long_${pol}_$r.json 2> $R/long_${pol}_$r.err
done; done
python3 - $R <<'PY' | tee $OUT/lc.txt
import json, sys
for r in (1, 2):
    d = {p: json.load(open(f"{sys.argv[1]}/long_{p}_{r}.json")) for p in ("full", "qevict")}
    for p, j in d.items(): print(f"round {r} long_ctx {p:7s} {j['sequences']:4d} seqs, step {j['step_ms']:8.3f} ms, {j['tokens_per_s']:8.1f} tok/s, route {j['route_ms_per_step']:.3f} ms")
    print("round %d qevict / full: %.2fx sequences, %.3fx tokens/s" % (r, d['qevict']['sequences'] / d['full']['sequences'], d['qevict']['tokens_per_s'] / d['full']['tokens_per_s']))
PY
echo "== $SECONDS s"
(cd $OUT && tar czf r.tgz --remove-files r)
