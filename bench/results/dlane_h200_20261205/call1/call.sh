# call 1 (2026-12-05, twenty-third session): KCA_DLANE (the FullKV walk's descriptors a batch of
# 32 ahead, one per lane, read by shuffles) against the tree before it (carry/old: e403777), with
# cuDNN in the same rounds; the GPU checks of the new tree and compute-sanitizer on attn_decode
export PACK=carry/pack; source bench/device_unpack.sh
export QE_SHARED_MODELS=$(pwd)/carry/models
R=$OUT/r; mkdir -p $R; O=/tmp/qe/old; mkdir -p $O
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" carry/old/attn_decode.xz $O/attn_decode
chmod +x $O/attn_decode
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
timeout 120 attn_decode > $R/check.log 2>&1; echo "attn_decode checks rc $?: $(grep -c '^FAIL' $R/check.log) FAIL; $(tail -1 $R/check.log | cut -c1-100)"
for v in old new; do X=/tmp/qe/bin/attn_decode; [ $v = old ] && X=$O/attn_decode
  cuobjdump --dump-resource-usage $X 2>/dev/null | grep -A1 'kca_chunk_kernelILi128ELi0ELi0ELi1ELi0ELb0E' | grep -o 'REG:[0-9]*\|STACK:[0-9]*\|LOCAL:[0-9]*' | tr '\n' ' '; echo " <- $v FullKV chunk kernel"
done
ab() { # ROUND
  python3 bench/sdpa_queued.py --shapes 8x32768,32x1280,32x32768 > $R/peer_$1.log 2>&1
  for v in old new; do X=/tmp/qe/bin/attn_decode; [ $v = old ] && X=$O/attn_decode
    ATTN_CHUNKS=4 timeout 120 $X --bench --shapes full_b8_s32768,full_b32_s1280,full_b32_s32768 > $R/ab_${v}_$1.log 2>&1
  done
}
ab 1; ab 2; ab 3
python3 - $R <<'PY' | tee $OUT/ab.txt
import json, sys
R = sys.argv[1]
def lines(f):
    for l in open(f):
        if l.startswith('{'): yield json.loads(l)
for r in (1, 2, 3):
    peer = {(j['batch'], j['seq']): j['ms_gpu'] for j in lines(f'{R}/peer_{r}.log') if j.get('peer') == 'torch-sdpa-cudnn'}
    for sh, key in (('full_b8_s32768', (8, 32768)), ('full_b32_s1280', (32, 1280)), ('full_b32_s32768', (32, 32768))):
        t = {}
        for v in ('old', 'new'):
            x = [j['ms_gpu'] for j in lines(f'{R}/ab_{v}_{r}.log') if j.get('bench') == sh + '_no_masses' and 'frac_copy_bw_gpu' in j]
            t[v] = x[0] if x else None
        c = peer.get(key)
        if t['old'] and t['new'] and c:
            print(f"round {r} {sh:16s} cuDNN {c:.4f}  old {t['old']:.4f} ({t['old']/c:.3f}x)  new {t['new']:.4f} ({t['new']/c:.3f}x cuDNN, {t['new']/t['old']:.3f}x old)")
PY
timeout 150 test_model_graph > $R/tmg.log 2>&1; echo "test_model_graph rc $?: $(tail -1 $R/tmg.log | cut -c1-200)"
timeout 100 compute-sanitizer --tool memcheck --leak-check full attn_decode --small > $R/memcheck.log 2>&1; echo "memcheck rc $?: $(tail -1 $R/memcheck.log)"
timeout 150 compute-sanitizer --tool racecheck attn_decode --small > $R/racecheck.log 2>&1; echo "racecheck rc $?: $(tail -1 $R/racecheck.log)"
(cd $OUT && tar czf r.tgz --remove-files r)
