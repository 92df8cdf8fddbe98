# call 9 (2026-12-05, twenty-second session): the FullKV walk's descriptors, three ways, one call:
# old (the pack: decoded right after the load), draw1 (carry/new: loaded one tile ahead, decoded
# at issue), draw2 (carry/new2: also the next window's prefetched into L1 two tiles ahead)
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r; mkdir -p $R; N=/tmp/qe/new; N2=/tmp/qe/new2; mkdir -p $N $N2
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" carry/new/attn_decode.xz $N/attn_decode
python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" carry/new2/attn_decode.xz $N2/attn_decode
chmod +x $N/* $N2/*
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
timeout 120 $N2/attn_decode > $R/check_new2.log 2>&1; echo "draw2 attn_decode checks rc $?: $(grep -c '^FAIL' $R/check_new2.log) FAIL; $(tail -1 $R/check_new2.log | cut -c1-100)"
ab() { # ROUND
  python3 bench/sdpa_queued.py --shapes 8x32768,32x1280 > $R/peer_$1.log 2>&1
  for v in old draw1 draw2; do
    X=/tmp/qe/bin/attn_decode; [ $v = draw1 ] && X=$N/attn_decode; [ $v = draw2 ] && X=$N2/attn_decode
    ATTN_CHUNKS=4 timeout 120 $X --bench --shapes full_b8_s32768,full_b32_s1280 > $R/ab_${v}_$1.log 2>&1
  done
}
ab 1; ab 2
python3 - $R <<'PY'
import json, sys
R = sys.argv[1]
def lines(f):
    for l in open(f):
        if l.startswith('{'): yield json.loads(l)
for r in (1, 2):
    peer = {(j['batch'], j['seq']): j['ms_gpu'] for j in lines(f'{R}/peer_{r}.log') if j.get('peer') == 'torch-sdpa-cudnn'}
    for sh, key in (('full_b8_s32768', (8, 32768)), ('full_b32_s1280', (32, 1280))):
        out = []
        for v in ('old', 'draw1', 'draw2'):
            t = [j['ms_gpu'] for j in lines(f'{R}/ab_{v}_{r}.log') if j.get('bench') == sh + '_no_masses' and 'frac_copy_bw_gpu' in j]
            out.append((v, t[0] if t else None))
        c = peer.get(key); o = out[0][1]
        print(f'round {r} {sh:15s} cuDNN {c:.4f} ' + ' '.join(f'{v} {t:.4f} ({t / o:.3f}x old, {t / c:.3f}x cuDNN)' for v, t in out if t))
PY
(cd $OUT && tar czf r.tgz --remove-files r)
