source bench/device_unpack.sh
cd $OUT
run() { # NAME ENV...
  local name=$1; shift
  env "$@" timeout 100 qevict generate --shape llama3-8b --json --ignore-eos --device 0 --batch 8 --prompt-len 32768 -n 64 --policy qevict --budget 0.2 > eng_$name.json 2> eng_$name.err
  python3 -c "
import json
for l in open('eng_$name.json'):
  if l.startswith('{'):
    j=json.loads(l); s=j['summary']; m=j['memory']; print('engine $name TPOT ms %.3f TTFT ms %.1f'%(s['decode_s']/(s['steps']-1)*1e3, s['prefill_s']*1e3), j['graphs'], 'faults', m.get('pool_faults'))"
}
run eager_default QE_CUDA_GRAPHS=0
run eager_nolead QE_CUDA_GRAPHS=0 QE_CUDA_ATTN_LEAD=0
tar czf res.tgz --remove-files *.json *.err
