source bench/device_unpack.sh
for pol in full qevict; do extra=""; [ $pol = qevict ] && extra="--policy qevict --budget 0.2"
  timeout 150 qevict generate --shape llama3-8b --json --ignore-eos --device 0 --batch 32 --prompt-len 256 -n 1024 $extra > $OUT/eng_$pol.json 2> $OUT/eng_$pol.err
  python3 -c "
import json
for l in open('$OUT/eng_$pol.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; print('engine $pol TPOT ms %.3f TTFT ms %.1f'%(s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3), {k:v for k,v in s.items() if 'rout' in k or 'graph' in k})"
done
cd $OUT && tar czf c11.tgz --remove-files *.json *.err
