# call 7 (2026-12-05, twenty-second session): where the FullKV chunk kernel's tile waits, for the
# next attempt at its chain (call 6: its time follows the SM clock): Nsight Compute's SASS source
# page of one B=8 32K launch, joined with the cubin's line table (tools/ncu_sass_lines.py), and
# the instruction mix and stall reasons (tools/ncu_sass_summary.py)
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r; mkdir -p $R
K=_Z16kca_chunk_kernelILi128ELi0ELi0ELi1ELi0ELb0EEv12kca_params_t
ATTN_CHUNKS=4 timeout 300 ncu --clock-control none --set full -k regex:kca_chunk_kernel --launch-skip 30 --launch-count 1 --page source --print-source sass --csv attn_decode --bench --shapes full_b8_s32768 > $R/ncu_src.csv 2> $R/ncu.err
echo "ncu rc $?: $(wc -c < $R/ncu_src.csv) bytes"
mkdir -p /tmp/cub && cd /tmp/cub && cuobjdump -xelf all /tmp/qe/bin/attn_decode > /dev/null 2>&1
ls | head -3; echo "$(ls | wc -l) cubins"
for c in *.cubin; do
  nvdisasm -gi $c > /tmp/cub/l.txt 2>/dev/null || continue
  k=$(grep -o '_Z16kca_chunk_kernelILi128ELi0ELi0ELi1ELi0ELb0EE[A-Za-z0-9_]*' /tmp/cub/l.txt | head -1)
  if [ -n "$k" ]; then K=$k; mv /tmp/cub/l.txt $R/lines.txt; echo "line table from $c, kernel $K"; break; fi
done
cd - > /dev/null
python3 tools/ncu_sass_summary.py $R/ncu_src.csv > $R/summary.txt 2>&1; head -45 $R/summary.txt
TOPSTALL=25 python3 tools/ncu_sass_lines.py $R/ncu_src.csv $R/lines.txt $K 40 > $R/lines_top.txt 2>&1; head -80 $R/lines_top.txt
rm -f $R/lines.txt; gzip $R/ncu_src.csv
