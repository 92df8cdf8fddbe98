source bench/device_unpack.sh
cd $OUT
run() { # NAME ENV... -- ARGS
  local name=$1; shift
  env "$@" timeout 130 qevict generate --shape llama3-8b --json --ignore-eos --device 0 --batch 8 --prompt-len 32768 -n 128 $POL > eng_$name.json 2> eng_$name.err
  echo "$name rc $?"
  python3 -c "
import json
for l in open('eng_$name.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; print('engine $name TPOT ms %.3f TTFT ms %.1f'%(s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3), {k:v for k,v in s.items() if 'rout' in k or 'graph' in k or 'fault' in k})"
  tail -2 eng_$name.err
}
POL="--policy qevict --budget 0.2" run q_lead QE_X=1
POL="--policy qevict --budget 0.2" run q_nolead QE_CUDA_ATTN_LEAD=0
POL="--policy qevict --budget 0.2" run q_lead2 QE_X=1
POL="" run full QE_X=1
tar czf res.tgz --remove-files *.json *.err
