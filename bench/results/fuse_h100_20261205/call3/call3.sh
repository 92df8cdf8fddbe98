# call 3 (2026-12-05, twenty-first session): call 1 again after the FFN past MODEL_FUSE_ROWS runs the stacked weights in halves; long_ctx and the 32K TTFT (no transformers: call 2 ran it)
bash carry/call1.sh
echo "== call 1 part took $SECONDS s"
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r2; mkdir -p $R
if [ -n "${WITH_HF:-}" ] && [ $SECONDS -lt 440 ]; then
  timeout 120 python3 carry/peers/peers.py hf-e2e --batch 32 --prompt 256 --new 1024 > $R/hf.json 2> $R/hf.err
  python3 -c "
import json
h = json.loads(open('$R/hf.json').read().strip().splitlines()[-1])
print('transformers eager B=32: TTFT %.1f ms, TPOT %.2f ms, %.0f tokens/s' % (h['ttft_ms'], h['tpot_ms'], h['tokens_per_s']))" || echo "hf failed: $(tail -2 $R/hf.err)"
fi
if [ $SECONDS -lt 330 ]; then
  for pol in full qevict; do
    timeout 100 long_ctx --policy $pol --budget 0.2 --ctx 32768 --new 200 > $R/long_$pol.json 2> $R/long_$pol.err
    echo "long_ctx $pol rc $?: $(tail -1 $R/long_$pol.err | cut -c1-160)"
  done
  python3 - $R <<'PY'
import json, sys
d = {}
for p in ("full", "qevict"):
    try: d[p] = json.load(open(f"{sys.argv[1]}/long_{p}.json"))
    except Exception as e: print(p, "unreadable", e); continue
    j = d[p]; print(f"long_ctx {p:7s} {j['sequences']:4d} sequences, step {j['step_ms']:8.3f} ms, {j['tokens_per_s']:8.1f} tokens/s, route {j['route_ms_per_step']:.3f} ms, GPU {j['gpu_used_gb']:.1f} GB")
if len(d) == 2:
    print("qevict / full: %.2fx sequences, %.3fx tokens/s" % (d['qevict']['sequences'] / d['full']['sequences'], d['qevict']['tokens_per_s'] / d['full']['tokens_per_s']))
PY
fi
for pol in full q20; do
  [ $SECONDS -lt 520 ] || break
  P=""; [ $pol = q20 ] && P="--policy qevict --budget 0.2"
  timeout 60 qevict generate --json --ignore-eos --shape llama3-8b --device 0 --prompt-len 32768 -n 1 $P > $R/ttft_$pol.json 2> $R/ttft_$pol.err
  python3 -c "
import json
for l in open('$R/ttft_$pol.json'):
  if l.startswith('{'): print('TTFT one 32K prompt $pol: %.1f ms' % (json.loads(l)['summary']['prefill_s'] * 1e3))" || echo "ttft $pol failed: $(tail -1 $R/ttft_$pol.err)"
done
(cd $OUT && tar czf r2.tgz --remove-files r2)
echo "== total $SECONDS s"
