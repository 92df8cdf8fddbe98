# call 8 (2026-12-05, twenty-second session): the FullKV walk's descriptor kept as loaded across a
# tile's work and decoded at its issue (KCA_DRAW; call 7's profile put 70% of the FullKV kernel's
# stall samples on the decode right after the load). New binaries (carry/new) against the pack's
# (the tree before): attn_decode's checks, test_model_graph, then FullKV attention A/B with cuDNN
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r; mkdir -p $R; N=/tmp/qe/new; mkdir -p $N
for f in carry/new/*.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" $f $N/$(basename $f .xz); done; chmod +x $N/*
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
timeout 120 $N/attn_decode > $R/check_new.log 2>&1; echo "new attn_decode checks rc $?: $(grep -c '^FAIL' $R/check_new.log) FAIL; $(tail -1 $R/check_new.log | cut -c1-100)"
timeout 120 $N/test_model_graph > $R/tmg_new.log 2>&1; echo "new test_model_graph rc $?: $(tail -1 $R/tmg_new.log | cut -c1-160)"
ab() { # ROUND
  python3 bench/sdpa_queued.py --shapes 8x32768,32x1280,32x32768 > $R/peer_$1.log 2>&1
  for v in old new; do
    X=/tmp/qe/bin/attn_decode; [ $v = new ] && X=$N/attn_decode
    ATTN_CHUNKS=4 timeout 120 $X --bench --shapes full_b8_s32768,full_b32_s1280,full_b32_s32768 > $R/ab_${v}_$1.log 2>&1
  done
}
ab 1; ab 2
python3 - $R <<'PY'
import json, sys, glob
R = sys.argv[1]
def lines(f):
    for l in open(f):
        if l.startswith('{'): yield json.loads(l)
for r in (1, 2):
    peer = {(j['batch'], j['seq']): j['ms_gpu'] for j in lines(f'{R}/peer_{r}.log') if j.get('peer') == 'torch-sdpa-cudnn'}
    row = {}
    for v in ('old', 'new'):
        for j in lines(f'{R}/ab_{v}_{r}.log'):
            b = j.get('bench', '')
            if b.endswith('_no_masses') and 'frac_copy_bw_gpu' in j: row[(v, b[:-10])] = j['ms_gpu']
            if b.endswith('_no_masses') and 'ms_gpu_chunk_kernel_only' in j and j['chunk_win'] == j.get('chunk_win'): row.setdefault((v, b[:-10], 'ck'), j['ms_gpu_chunk_kernel_only'])
    for sh, key in (('full_b8_s32768', (8, 32768)), ('full_b32_s1280', (32, 1280)), ('full_b32_s32768', (32, 32768))):
        o, n, c = row.get(('old', sh)), row.get(('new', sh)), peer.get(key)
        if o and n: print(f'round {r} {sh:16s} old {o:.4f} new {n:.4f} ({n / o:.3f}x) cuDNN {c}  new/cuDNN {n / c if c else 0:.3f} old/cuDNN {o / c if c else 0:.3f}  chunk only old {row.get(("old", sh, "ck"))} new {row.get(("new", sh, "ck"))}')
PY
(cd $OUT && tar czf r.tgz --remove-files r)
