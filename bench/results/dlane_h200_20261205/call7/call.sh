# call 7 (2026-12-05, twenty-third session): the decode attention at long_ctx's shapes, the
# seventeenth session's final tree (carry/old/attn_decode17: 2f011be) against this tree
# (/tmp/qe/bin) and this tree with KCA_QLATE=0 (carry/old/attn_decode_ql0): is the QEvict step's
# 0.8% (call 5) in the tiered kernel at 121 sequences?
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r; mkdir -p $R; O=/tmp/qe/old; mkdir -p $O
for b in attn_decode17 attn_decode_ql0; do
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" carry/old/$b.xz $O/$b
done
chmod +x $O/*
nvidia-smi --query-gpu=name --format=csv,noheader
SH=lc_q20_w8_b121_s32768,abs_tiered20_w8_b8_s32768,lc_fkv_b29_s32768
for r in 1 2; do
  for v in old17 new ql0; do X=/tmp/qe/bin/attn_decode; [ $v = old17 ] && X=$O/attn_decode17; [ $v = ql0 ] && X=$O/attn_decode_ql0
    timeout 150 $X --bench --shapes $SH > $R/ab_${v}_$r.log 2>&1
  done
  echo "== round $r $SECONDS s"
done
python3 - $R <<'PY' | tee $OUT/ab.txt
import json, sys
R = sys.argv[1]
def pick(f, sh):
    for l in open(f):
        if not l.startswith('{'): continue
        j = json.loads(l); b = j.get('bench', '')
        if sh.startswith('lc_fkv') and b == sh + '_no_masses' and 'frac_copy_bw_gpu' in j: return j['ms_gpu']
        if not sh.startswith('lc_fkv') and b == sh and j.get('auto'): return j['ms_gpu']
for r in (1, 2):
    for sh in ('lc_q20_w8_b121_s32768', 'abs_tiered20_w8_b8_s32768', 'lc_fkv_b29_s32768'):
        t = {v: pick(f'{R}/ab_{v}_{r}.log', sh) for v in ('old17', 'new', 'ql0')}
        o = t['old17']
        print(f"round {r} {sh:26s} " + '  '.join(f"{v} {x:.4f}" + (f" ({x / o:.3f}x)" if o else '') for v, x in t.items() if x))
PY
(cd $OUT && tar czf r.tgz --remove-files r)
