# call 4 (2026-12-05, twenty-second session): attn_decode's checks (now with runs without masses
# compared with the run with masses) and decode_steps at B=8 32K; then on an H200 only: the tree's
# attention record against cuDNN, the engine at B=32 with and without the stacked projections of
# the twenty-first session (which the H200 had not run), long_ctx at 32K, the engine at B=8 32K
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
eng() { # NAME ARGS...
  local name=$1; shift
  /usr/bin/time -v timeout 150 qevict generate --shape llama3-8b --json --ignore-eos --device 0 "$@" > $R/e_$name.json 2> $R/e_$name.err
  python3 -c "
import json
for l in open('$R/e_$name.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; print('engine %-12s TPOT ms %.3f prefill s %.2f eager %d' % ('$name', s['decode_s']/s.get('decode_steps', s['steps']-1)*1e3, s['prefill_s'], j['graphs']['eager_steps']), 'ids', j['tokens'][:6], 'mem', {k: v for k, v in j['memory'].items() if k in ('policy', 'pool_faults', 'peak_bytes', 'kv_bytes')})" 2>/dev/null || echo "engine $name failed: $(grep -v '^\s' $R/e_$name.err | tail -2)"
}
attn() { # ROUND: the attention record's shapes and cuDNN, GPU time
  python3 bench/sdpa_queued.py --shapes 32x1280,8x32768,32x32768 > $R/peer_$1.log 2>&1
  ATTN_CHUNKS=4 timeout 200 attn_decode --bench --shapes full_b32_s1280,full_b8_s32768,abs_tiered20_w8_b8,full_b32_s32768,abs_tiered20_w8_b32_s32768 > $R/attn_$1.log 2>&1
  python3 - $R $1 <<'PY'
import json, sys
R, r = sys.argv[1], sys.argv[2]
peer = {}
for l in open(f'{R}/peer_{r}.log'):
    if l.startswith('{'):
        j = json.loads(l)
        if j['peer'] == 'torch-sdpa-cudnn': peer[(j['batch'], j['seq'])] = j['ms_gpu']
full = {}
for l in open(f'{R}/attn_{r}.log'):
    if not l.startswith('{'): continue
    j = json.loads(l)
    b = j.get('bench', '')
    if b.endswith('_no_masses') and 'frac_copy_bw_gpu' in j and b.startswith('full_b'):
        sh = b[:-len('_no_masses')]
        bs, sq = int(sh.split('_b')[1].split('_s')[0]), int(sh.split('_s')[1])
        if sh not in full:
            full[sh] = j['ms_gpu']
            c = peer.get((bs, sq))
            print(f'round {r} {sh:18s} no masses {j["ms_gpu"]:.4f} ms, of copy {j.get("frac_copy_bw_gpu", 0):.3f}, cuDNN {c}, ratio {j["ms_gpu"] / c if c else 0:.3f}')
    if b.startswith('abs_tiered20') and j.get('auto'):
        print(f'round {r} {b:28s} {j["ms_gpu"]:.4f} ms, ratio to FullKV (masses) {j.get("ratio_to_full_gpu")}')
PY
}
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
timeout 120 attn_decode > $R/check.log 2>&1; echo "attn_decode checks rc $?: $(grep -c '^FAIL' $R/check.log) FAIL; $(grep -c 'no masses' $R/check.log) runs without masses; $(tail -1 $R/check.log | cut -c1-120)"
attn 1
echo "== $SECONDS s"
eng full_b32 --batch 32 --prompt-len 256 -n 1024
eng q20_b32 --batch 32 --prompt-len 256 -n 1024 --policy qevict --budget 0.2
QE_CUDA_FUSE_PROJ=0 eng full_b32_apart --batch 32 --prompt-len 256 -n 1024
QE_CUDA_FUSE_PROJ=0 eng q20_b32_apart --batch 32 --prompt-len 256 -n 1024 --policy qevict --budget 0.2
echo "== $SECONDS s"
if [ $SECONDS -lt 300 ]; then
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
[ $SECONDS -lt 430 ] && { eng q20_b8_32k --batch 8 --prompt-len 32768 -n 128 --policy qevict --budget 0.2
python3 -c "
import json
for l in open('$R/e_q20_b8_32k.json'):
  if l.startswith('{'):
    s=json.loads(l)['summary']; print('q20_b8_32k steps', s['steps'], 'decode_steps', s['decode_steps'], 'decode_tokens', s['decode_tokens'], 'TPOT over decode steps %.3f ms' % (s['decode_s'] / s['decode_steps'] * 1e3))" || true
}
echo "== $SECONDS s"
[ $SECONDS -lt 470 ] && attn 2
[ $SECONDS -lt 510 ] && eng full_b8_32k --batch 8 --prompt-len 32768 -n 128
echo "== total $SECONDS s"
(cd $OUT && tar czf r.tgz --remove-files r)
