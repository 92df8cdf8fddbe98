# call 5 (2026-12-05, twenty-second session): generate --max-batch on the tiered GPU cache, which
# takes a prompt in one piece (a split prompt is an error there): B=4 prompts of 8192 tokens,
# QEvict 20%, passes of two prompts (--max-batch 20000: 19,996 rows beside the decode rows, two
# whole prompts) and of one (--max-batch 12000), against the default (16,384 tokens: two prompts a pass)
export PACK=carry/pack; source bench/device_unpack.sh
R=$OUT/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv,noheader
for mb in 0 20000 12000; do
  extra=""; [ $mb -gt 0 ] && extra="--max-batch $mb"
  timeout 120 qevict generate --shape llama3-8b --device 0 --batch 4 --prompt-len 8192 -n 64 --ignore-eos --json --policy qevict --budget 0.2 $extra > $R/mb_$mb.json 2> $R/mb_$mb.err
  echo "max-batch $mb rc $?: $(python3 -c "
import json
for l in open('$R/mb_$mb.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; print('steps', s['steps'], 'decode_steps', s['decode_steps'], 'decode_tokens', s['decode_tokens'], 'prefill s %.2f' % s['prefill_s'], 'TPOT %.3f ms' % (s['decode_s'] / s['decode_steps'] * 1e3), 'pool_faults', j['memory'].get('pool_faults'), 'ids', j['tokens'][:6])" 2>/dev/null || tail -1 $R/mb_$mb.err)"
done
(cd $OUT && tar czf r.tgz --remove-files r)
